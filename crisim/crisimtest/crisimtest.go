// Package crisimtest serves the simulated CRI runtime for tests: a real gRPC
// server on a unix socket in the test's temporary directory, stopped when the
// test ends; and it builds the event stream messages of a kubelet's node
// (KubeletEvents) for the tests of the stream's decoding and conversion.
// Only tests import it.
package crisimtest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// Serve serves model over a unix socket until the test ends and returns the
// server (for fault injection and call counts) and the endpoint in crictl's
// form. The socket accepts connections when Serve returns. A Serve that ends
// with an error fails the test.
func Serve(t testing.TB, model *crisim.Runtime) (*crisim.Server, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	lis, err := crisim.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := crisim.NewServer(model, crisim.ServerOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve simulated runtime: %v", err)
		}
	})
	return srv, "unix://" + sock
}
