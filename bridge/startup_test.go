package bridge_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pleg-bridge/pleg-bridge/bridge"
)

// TestRunWithTheEmbeddedNATSPortTakenSaysWhichOption: the embedded server's
// port is taken; Run fails at once with the address, "address already in
// use", and a ListenError that names the option, so that the command can
// name its variable.
func TestRunWithTheEmbeddedNATSPortTakenSaysWhichOption(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	opts := testOptions("unix:///nonexistent/cri.sock", "", t.TempDir())
	opts.NATS.EmbeddedListen = taken.Addr().String()
	b, err := bridge.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = b.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run waited out its context with the embedded NATS port taken: %v", err)
	}
	var le *bridge.ListenError
	if !errors.As(err, &le) || le.Option != bridge.OptionEmbeddedListen || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Run = %v, want a ListenError of %s wrapping EADDRINUSE", err, bridge.OptionEmbeddedListen)
	}
	for _, want := range []string{taken.Addr().String(), "address already in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run = %q, does not say %q", err, want)
		}
	}
}
