package natsembed_test

import (
	"strings"
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
