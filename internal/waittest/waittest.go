package waittest

import (
	"context"
	"testing"
	"time"
)

// The backoff between two calls of a condition: from firstPoll, doubled
// each round up to maxPoll, so that a condition that holds soon is seen
// soon and one that takes seconds is not called thousands of times.
const (
	firstPoll = time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// Until calls done until it reports true, and fails t (from the test's
// goroutine) if timeout passes first or the test's context ends. what
// names what is waited for ("the bridge to settle"); the error done
// returns, if any, says what it saw last, and the failure quotes it. done
// may fail t itself on an error no waiting will mend.
func Until(t testing.TB, timeout time.Duration, what string, done func() (bool, error)) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	wait := firstPoll
	for {
		ok, err := done()
		if ok {
			return
		}
		retry := time.NewTimer(wait)
		select {
		case <-retry.C:
		case <-deadline.C:
			retry.Stop()
			if err != nil {
				t.Fatalf("still waiting for %s after %v: %v", what, timeout, err)
			}
			t.Fatalf("still waiting for %s after %v", what, timeout)
		case <-t.Context().Done():
			retry.Stop()
			t.Fatalf("still waiting for %s when the test ended: %v", what, context.Cause(t.Context()))
		}
		wait = min(2*wait, maxPoll)
	}
}
