package bridge

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// TestTokenFileIsReadAgainAtReconnect rotates the token of a real server:
// the server drops the bridge's connection, and the bridge reconnects with
// the new token it reads from the token file, as when a Kubernetes Secret
// is rotated.
func TestTokenFileIsReadAgainAtReconnect(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, Authorization: "first-token"}
	s := publishtest.RunServer(t, opts)

	logs := &logtest.Buffer{}
	nc, err := connectNATS(s.ClientURL(), "pleg-bridge node-1", NATSOptions{TokenFile: tokenFile}, nil, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if !nc.IsConnected() {
		t.Fatalf("not connected with the token from the file: %v\n%s", nc.LastError(), logs.String())
	}

	reconnected := nc.StatusChanged(nats.CONNECTED)
	if err := os.WriteFile(tokenFile, []byte("second-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rotated := opts.Clone()
	rotated.Authorization = "second-token"
	if err := s.ReloadOptions(rotated); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(15 * time.Second):
		t.Fatalf("did not reconnect with the rotated token within 15s: %v\n%s", nc.LastError(), logs.String())
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("connection after the rotation: %v", err)
	}
}

func TestTokenFileThatCannotBeReadKeepsTheLastToken(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("  tok-1 \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	next := tokenFromFile(path, slog.New(slog.NewTextHandler(&logs, nil)))
	if got := next(); got != "tok-1" {
		t.Fatalf("token = %q, want %q without the surrounding whitespace", got, "tok-1")
	}
	if err := os.WriteFile(path, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "tok-1" {
		t.Errorf("token after the file was emptied = %q, want the last one read", got)
	}
	if !strings.Contains(logs.String(), "token file") || !strings.Contains(logs.String(), path) || !strings.Contains(logs.String(), "empty") {
		t.Errorf("the unreadable token file was not logged with its path and reason:\n%s", logs.String())
	}
}
