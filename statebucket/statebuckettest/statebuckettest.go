// Package statebuckettest runs state bucket writers in tests, as bridges
// do, for the tests of statebucket and of what reads the bucket.
package statebuckettest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/statebucket"
)

// stopTimeout bounds the wait for Run to return once it is stopped: its
// drain is bounded by the writer's DrainTimeout (10 s by default).
const stopTimeout = 30 * time.Second

// Run runs w until the test ends, and returns the function that stops it
// earlier: it cancels Run's context and waits for Run to return. It fails
// the test if Run returns an error or does not return within 30 s of the
// stop. Calling stop again does nothing.
func Run(t testing.TB, w *statebucket.Writer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("state writer Run: %v", err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("state writer Run did not return within %s of the stop", stopTimeout)
		}
	}
	t.Cleanup(stop)
	return stop
}

// Start returns a Writer made with js and opts (statebucket.New), run
// until the test ends (Run). It fails the test if New fails.
func Start(t testing.TB, js jetstream.JetStream, opts statebucket.Options) *statebucket.Writer {
	t.Helper()
	w, err := statebucket.New(js, opts)
	if err != nil {
		t.Fatalf("create state writer: %v", err)
	}
	Run(t, w)
	return w
}
