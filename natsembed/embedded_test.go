package natsembed_test

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

func TestStartServesJetStream(t *testing.T) {
	t.Parallel()
	s, err := natsembed.Start(natsembed.Options{DataDir: t.TempDir(), Port: -1, ServerName: "bridge-test"})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if s.Name() != "bridge-test" {
		t.Errorf("server name = %q, want bridge-test", s.Name())
	}
	_, js := publishtest.Connect(t, s.ClientURL())
	if _, err := js.AccountInfo(t.Context()); err != nil {
		t.Errorf("JetStream account info: %v", err)
	}
}

func TestStartNamesWhatFailed(t *testing.T) {
	t.Parallel()
	_, err := natsembed.Start(natsembed.Options{Port: -1})
	if err == nil || !strings.Contains(err.Error(), "data dir is empty") {
		t.Errorf("Start without a data dir: error = %v, want one about the data dir", err)
	}
}

// TestStartOnATakenPortSaysSo holds the port Start is asked for: Start
// returns the listen error, naming the address, rather than waiting for a
// server that can never be ready.
func TestStartOnATakenPortSaysSo(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, err = natsembed.Start(natsembed.Options{DataDir: t.TempDir(), Host: "127.0.0.1", Port: port})
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) {
		t.Errorf("Start on a taken port: error = %v, want address in use, naming 127.0.0.1:%d", err, port)
	}
}

func TestSplitListenTakesHostAndPortOrNamesTheAddress(t *testing.T) {
	t.Parallel()
	host, port, err := natsembed.SplitListen("127.0.0.1:-1")
	if err != nil || host != "127.0.0.1" || port != -1 {
		t.Errorf("SplitListen(127.0.0.1:-1) = %q, %d, %v", host, port, err)
	}
	for _, bad := range []string{"4222", "127.0.0.1:http", "127.0.0.1:70000", ":-2"} {
		if _, _, err := natsembed.SplitListen(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("SplitListen(%q) error = %v, want one naming the address", bad, err)
		}
	}
}
