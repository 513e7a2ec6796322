package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
)

// startEmbeddedNATS starts the in-process NATS server with JetStream that
// the bridge uses when PLEG_NATS_URL is unset. The caller shuts it down.
func startEmbeddedNATS(listen, dataDir string, logger *slog.Logger) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("PLEG_EMBEDDED_NATS_LISTEN=%q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return nil, fmt.Errorf("PLEG_EMBEDDED_NATS_LISTEN=%q: bad port %q", listen, portStr)
	}
	store := filepath.Join(dataDir, "nats")
	if err := os.MkdirAll(store, 0o750); err != nil {
		return nil, fmt.Errorf("create embedded NATS store (PLEG_DATA_DIR=%q): %w", dataDir, err)
	}
	s, err := natsembed.Start(natsembed.Options{DataDir: store, Host: host, Port: port, ServerName: "pleg-bridge-embedded"})
	if err != nil {
		return nil, err
	}
	logger.Info("started embedded NATS server with JetStream; connect with the nats CLI or pleg-bridge tail",
		"url", s.ClientURL(), "store", store)
	return s, nil
}

// connectNATS connects with the configured credentials and TLS, and keeps
// reconnecting forever: NATS being away is normal, and events wait in the
// outbox meanwhile.
func connectNATS(url string, cfg Config, logger *slog.Logger) (*nats.Conn, error) {
	log := logger.With("component", "nats")
	opts := []nats.Option{
		nats.Name("pleg-bridge " + cfg.NodeName),
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
	if cfg.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	}
	if cfg.NATSNKeySeed != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNKeySeed)
		if err != nil {
			return nil, fmt.Errorf("PLEG_NATS_NKEY_SEED=%q: %w", cfg.NATSNKeySeed, err)
		}
		opts = append(opts, o)
	}
	if cfg.NATSUser != "" {
		opts = append(opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
	}
	if cfg.NATSToken != "" {
		opts = append(opts, nats.Token(cfg.NATSToken))
	}
	if cfg.NATSTokenFile != "" {
		opts = append(opts, nats.TokenHandler(tokenFromFile(cfg.NATSTokenFile, log)))
	}
	if cfg.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSTLSCA))
	}
	if cfg.NATSTLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.NATSTLSCert, cfg.NATSTLSKey))
	}
	nc, err := nats.Connect(url, opts...)
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
		tok, err := readToken(path)
		if err != nil {
			log.Warn("cannot read PLEG_NATS_TOKEN_FILE, connecting with the token read before", "path", path, "err", err)
			return last
		}
		last = tok
		return tok
	}
}

// readToken reads a token file: its content without surrounding whitespace
// (an editor's or echo's newline), which must not be empty.
func readToken(path string) (string, error) {
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
