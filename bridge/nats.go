package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

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
	if opErr := (*net.OpError)(nil); errors.As(err, &opErr) && opErr.Op == "listen" {
		return nil, &ListenError{Option: OptionEmbeddedListen, Err: err}
	}
	if err != nil {
		return nil, err
	}
	logger.Info("started embedded NATS server with JetStream; connect with the nats CLI or pleg-bridge tail",
		"url", s.ClientURL(), "store", store)
	return s, nil
}

// connectNATS connects to url with the credentials and TLS of opts, as
// client name, and keeps reconnecting forever: NATS being away is normal,
// and events wait in the outbox and the spool meanwhile. connected is set
// to 1 while the connection is up and 0 while it is not. What the server
// refuses that a setting fixes is logged at Error with the setting, and
// kept in refused (which may be nil) for /readyz and the retries' logs.
//
// A server that cannot be reached is logged at Warn once, with the reason
// (connection refused, a name that does not resolve, an authorization
// violation) and the URL without its credentials, then at Debug for every
// further attempt until the connection is up again.
func connectNATS(url, name string, opts NATSOptions, refused *refusals, connected prometheus.Gauge, logger *slog.Logger) (*nats.Conn, error) {
	log := logger.With("component", "nats")
	redacted := RedactURLs(url)
	var failing atomic.Bool // a failed attempt was logged at Warn; the next success says so
	up := func(nc *nats.Conn, what string) {
		connected.Set(1)
		failing.Store(false)
		log.Info(what, "url", nc.ConnectedUrlRedacted())
	}
	nopts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(natsReconnectWait),
		nats.RetryOnFailedConnect(true),
		// With RetryOnFailedConnect, the first connection is reported
		// here, also when it is made by a retry.
		nats.ConnectHandler(func(nc *nats.Conn) { up(nc, "connected to NATS") }),
		nats.ReconnectHandler(func(nc *nats.Conn) { up(nc, "reconnected to NATS") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			connected.Set(0)
			refused.reset()
			if err != nil {
				log.Warn("disconnected from NATS, will reconnect", "err", err)
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { connected.Set(0) }),
		// Every failed attempt, the first connection's included. That one
		// reports only nats.ErrNoServers (the client drops "connection
		// refused" from its first round over the servers); each later
		// attempt reports its dial error, which names the cause.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if errors.Is(err, nats.ErrNoServers) || failing.Swap(true) {
				log.Debug("cannot connect to NATS", "url", redacted, "err", err)
				return
			}
			log.Warn("cannot connect to NATS, retrying in the background; events wait in the outbox and the spool meanwhile",
				"url", redacted, "err", err, "retry_every", natsReconnectWait)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if !refused.logRefusal(err, log) {
				log.Warn("NATS error", "err", err)
			}
		}),
	}
	auth, err := opts.ClientOptions(log)
	if err != nil {
		return nil, err
	}
	nopts = append(nopts, auth...)
	connected.Set(0)
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redacted, err)
	}
	return nc, nil
}

// newNATSConnectedGauge returns the gauge connectNATS keeps.
func newNATSConnectedGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pleg_bridge_nats_connected",
		Help: "1 while the bridge is connected to NATS, 0 while it is not (connecting, or reconnecting after a disconnect).",
	})
}

// natsReconnectWait is the pause between two attempts to reach NATS.
const natsReconnectWait = time.Second

// RedactURLs returns the comma-separated NATS URLs of urls with their
// credentials replaced: a password, and a user without a password, which
// NATS takes for a token.
func RedactURLs(urls string) string {
	var out []string
	for u := range strings.SplitSeq(urls, ",") {
		u = strings.TrimSpace(u)
		p, err := neturl.Parse(u)
		switch {
		case err != nil:
			// url.Parse's error would quote the URL, credentials and all.
			out = append(out, "(a URL that does not parse)")
			continue
		case p.User == nil:
		case func() bool { _, ok := p.User.Password(); return ok }():
			u = p.Redacted()
		default:
			p.User = neturl.User("xxxxx")
			u = p.String()
		}
		out = append(out, u)
	}
	return strings.Join(out, ",")
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

// ClientOptions returns the nats.go options that authenticate and secure a
// connection as o says: credentials file, NKey seed, user and password,
// token or token file (read again at every reconnect, a failure to read it
// logged on log), TLS CA and client certificate, and the inbox prefix. The
// bridge and the command-line tools connect with the same settings. An
// NKey seed file that cannot be read is an error naming it.
func (o NATSOptions) ClientOptions(log *slog.Logger) ([]nats.Option, error) {
	var nopts []nats.Option
	if o.Creds != "" {
		nopts = append(nopts, nats.UserCredentials(o.Creds))
	}
	if o.NKeySeed != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("read NATS NKey seed %q: %w", o.NKeySeed, err)
		}
		nopts = append(nopts, opt)
	}
	if o.User != "" {
		nopts = append(nopts, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		nopts = append(nopts, nats.Token(o.Token))
	}
	if o.TokenFile != "" {
		nopts = append(nopts, nats.TokenHandler(tokenFromFile(o.TokenFile, log)))
	}
	if o.TLSCA != "" {
		nopts = append(nopts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" {
		nopts = append(nopts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	if o.InboxPrefix != "" {
		nopts = append(nopts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	return nopts, nil
}
