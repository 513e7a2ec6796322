package natsembed

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// embeddedReadyTimeout bounds the wait for the embedded server to accept
// clients. Opening a JetStream store with a large stream on a slow disk can
// take a while; longer than this means something is wrong.
const embeddedReadyTimeout = 30 * time.Second

// Options configures the embedded NATS server of the bridge's default mode
// (no PLEG_NATS_URL).
type Options struct {
	// DataDir is where JetStream keeps its store. Required.
	DataDir string
	// Host is the listen address; empty means 127.0.0.1, so the embedded
	// server is not reachable from other hosts unless asked.
	Host string
	// Port is the client port; 0 means the NATS default (4222) and -1 a
	// random free port.
	Port int
	// ServerName names the server; empty lets the server pick its ID.
	ServerName string
}

// Start starts an in-process NATS server with JetStream enabled and its
// store in opts.DataDir, and waits until it accepts clients. The caller owns
// the server and stops it with Shutdown (then WaitForShutdown). The server
// logs nothing; its client URL is s.ClientURL().
func Start(opts Options) (*server.Server, error) {
	if opts.DataDir == "" {
		return nil, errors.New("start embedded nats server: data dir is empty")
	}
	if opts.Port >= 0 {
		// The server does not say that its listen failed: it would only
		// never be ready, and the caller would wait out the timeout.
		addr := net.JoinHostPort(hostOrDefault(opts.Host), strconv.Itoa(cmp.Or(opts.Port, server.DEFAULT_PORT)))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("start embedded nats server: %w", err)
		}
		l.Close()
	}
	s, err := server.NewServer(embeddedServerOptions(opts))
	if err != nil {
		return nil, fmt.Errorf("start embedded nats server: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(embeddedReadyTimeout) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("start embedded nats server on %s:%d (data dir %q): not ready for connections after %s",
			hostOrDefault(opts.Host), opts.Port, opts.DataDir, embeddedReadyTimeout)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("start embedded nats server: enable jetstream with store %q: jetstream did not start", opts.DataDir)
	}
	return s, nil
}

// embeddedServerOptions builds a fresh server.Options value on every call,
// so nothing shared is ever modified.
func embeddedServerOptions(opts Options) *server.Options {
	return &server.Options{
		ServerName: opts.ServerName,
		Host:       hostOrDefault(opts.Host),
		Port:       opts.Port,
		JetStream:  true,
		StoreDir:   opts.DataDir,
		// The bridge's main handles signals; the server must not.
		NoSigs: true,
		NoLog:  true,
	}
}

func hostOrDefault(host string) string {
	if host == "" {
		return "127.0.0.1"
	}
	return host
}

// SplitListen splits a listen address, host:port, into the Host and Port of
// Options: port -1 asks for a random free port. The error names the address.
func SplitListen(addr string) (host string, port int, err error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("listen address %q: %w", addr, err)
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("listen address %q: bad port %q (want 0 to 65535, or -1 for a random one)", addr, portStr)
	}
	return host, port, nil
}
