package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// startEmbedded starts the in-process NATS server with JetStream that the
// bridge uses without a NATS URL, its store in dataDir/nats. The caller
// shuts it down.
func startEmbedded(listen, dataDir string, logger *slog.Logger) (*server.Server, error) {
	host, port, err := natsembed.SplitListen(listen)
	if err != nil {
		return nil, fmt.Errorf("start embedded NATS server: %w", err)
	}
	store := filepath.Join(dataDir, "nats")
	if err := os.MkdirAll(store, 0o750); err != nil {
		return nil, fmt.Errorf("create embedded NATS store: %w", err)
	}
	s, err := natsembed.Start(natsembed.Options{DataDir: store, Host: host, Port: port, ServerName: "pleg-bridge-embedded"})
	if err != nil {
		return nil, err
	}
	logger.Info("started embedded NATS server with JetStream; connect with the nats CLI or pleg-bridge tail",
		"url", s.ClientURL(), "store", store)
	return s, nil
}

// connectNATS connects to url with the credentials and TLS of opts, as
// client name, and keeps reconnecting forever: NATS being away is normal,
// and events wait in the outbox and the spool meanwhile.
func connectNATS(url, name string, opts NATSOptions, logger *slog.Logger) (*nats.Conn, error) {
	log := logger.With("component", "nats")
	nopts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS, will reconnect", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("NATS error", "err", err) }),
	}
	if opts.Creds != "" {
		nopts = append(nopts, nats.UserCredentials(opts.Creds))
	}
	if opts.NKeySeed != "" {
		o, err := nats.NkeyOptionFromSeed(opts.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("read NATS NKey seed %q: %w", opts.NKeySeed, err)
		}
		nopts = append(nopts, o)
	}
	if opts.User != "" {
		nopts = append(nopts, nats.UserInfo(opts.User, opts.Password))
	}
	if opts.Token != "" {
		nopts = append(nopts, nats.Token(opts.Token))
	}
	if opts.TokenFile != "" {
		nopts = append(nopts, nats.TokenHandler(tokenFromFile(opts.TokenFile, log)))
	}
	if opts.TLSCA != "" {
		nopts = append(nopts, nats.RootCAs(opts.TLSCA))
	}
	if opts.TLSCert != "" {
		nopts = append(nopts, nats.ClientCert(opts.TLSCert, opts.TLSKey))
	}
	if opts.InboxPrefix != "" {
		nopts = append(nopts, nats.CustomInboxPrefix(opts.InboxPrefix))
	}
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	// With RetryOnFailedConnect, Connect returns at once; say where we are.
	if nc.IsConnected() {
		log.Info("connected to NATS", "url", nc.ConnectedUrlRedacted())
	} else {
		log.Warn("NATS not reachable yet, retrying in the background", "url", url)
	}
	return nc, nil
}

// ExpandInboxPrefix returns the inbox prefix pattern names for node:
// "{node}" replaced by the node's subject token (schemas.EncodeToken), as
// per-node credentials name the inbox they may subscribe to
// (_INBOX_{node}). An empty pattern stays empty (nats.go's _INBOX). It
// refuses a prefix that is not a literal subject: wildcards, whitespace,
// an empty token, or a trailing dot.
func ExpandInboxPrefix(pattern, node string) (string, error) {
	prefix := strings.ReplaceAll(pattern, "{node}", schemas.EncodeToken(node))
	if prefix == "" {
		return "", nil
	}
	for tok := range strings.SplitSeq(prefix, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsFunc(tok, unicode.IsSpace) {
			return "", fmt.Errorf("NATS inbox prefix %q: want a literal subject such as _INBOX_{node} (no wildcards, spaces or empty tokens)", pattern)
		}
	}
	return prefix, nil
}

// tokenFromFile returns a token handler that reads path at every connect:
// a Kubernetes Secret mounted as a file is updated in place when it is
// rotated, and the server drops connections whose token it no longer
// accepts, so the reconnect must present the new one. If the file cannot be
// read, the last token read is used and the failure logged.
func tokenFromFile(path string, log *slog.Logger) func() string {
	var mu sync.Mutex
	var last string
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		tok, err := ReadToken(path)
		if err != nil {
			log.Warn("cannot read the NATS token file, connecting with the token read before", "path", path, "err", err)
			return last
		}
		last = tok
		return tok
	}
}

// ReadToken reads a NATS token file as the bridge reads it at every
// connect: its content without surrounding whitespace (an editor's or
// echo's newline), which must not be empty. Configuration checks it with
// this before the bridge starts.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", errors.New("the file is empty")
	}
	return tok, nil
}
