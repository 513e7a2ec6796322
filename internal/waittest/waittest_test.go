package waittest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
)

// fatalT records the message of Fatalf and stops the caller there, as
// testing.T's FailNow does.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

// until runs waittest.Until on a fatalT over t and returns what it failed
// with, or "" if it returned.
func until(t *testing.T, timeout time.Duration, what string, done func() (bool, error)) (msg string) {
	ft := &fatalT{TB: t}
	defer func() {
		if r := recover(); r != nil && r != ft {
			panic(r)
		}
		msg = ft.msg
	}()
	waittest.Until(ft, timeout, what, done)
	return ""
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		calls := 0
		msg := until(t, time.Minute, "three calls", func() (bool, error) {
			calls++
			return calls == 3, nil
		})
		if msg != "" {
			t.Fatalf("Until failed: %s", msg)
		}
		if calls != 3 {
			t.Errorf("done called %d times, want 3", calls)
		}
		if waited := time.Since(start); waited > 10*time.Millisecond {
			t.Errorf("Until took %v for a condition true at the third call, want the short backoff", waited)
		}
	})
}

func TestUntilFailsNamingWhatItWaitedForAndWhatItSaw(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		msg := until(t, time.Second, "the bridge to settle", func() (bool, error) {
			calls++
			return false, errors.New("pending 3")
		})
		for _, want := range []string{"the bridge to settle", "1s", "pending 3"} {
			if !strings.Contains(msg, want) {
				t.Errorf("failure %q does not say %q", msg, want)
			}
		}
		// 1, 2, 4 ... 64 ms, then every 100 ms: about 16 calls in a second.
		if calls < 10 || calls > 20 {
			t.Errorf("done called %d times in 1s, want the backoff to call it 10 to 20 times", calls)
		}
	})
}
