package generator

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// scopeOf is a targeted relist of sandbox id, of its containers only or of
// the sandbox too.
func scopeOf(id string, containersOnly bool) relistScope {
	return relistScope{podUID: "uid-" + id, sandboxID: id, containersOnly: containersOnly}
}

// served is what Next returned, and when, counted from the test's start.
type served struct {
	Scope relistScope
	At    time.Duration
}

// queueTest runs fn in a synctest bubble with a new queue: time is virtual,
// so the times Next returns at are exact.
func queueTest(t *testing.T, delay time.Duration, perSecond float64, fn func(t *testing.T, q *targetedQueue, pending prometheus.Gauge, next func() served)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		pending := prometheus.NewGauge(prometheus.GaugeOpts{Name: "pending"})
		q := newTargetedQueue(delay, perSecond, pending)
		start := time.Now()
		next := func() served {
			t.Helper()
			s, err := q.Next(t.Context())
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			return served{s, time.Since(start)}
		}
		fn(t, q, pending, next)
		// Nothing else is waiting: Next blocks until its ctx gives up.
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		if s, err := q.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("after the test, Next = %+v, %v; want the queue empty", s, err)
		}
		if got := testutil.ToFloat64(pending); got != 0 {
			t.Errorf("pending gauge = %v with the queue empty", got)
		}
	})
}

// checkServed compares what Next returned with what it should have.
func checkServed(t *testing.T, want []served, got ...served) {
	t.Helper()
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(relistScope{})); diff != "" {
		t.Errorf("Next (-want +got):\n%s", diff)
	}
}

func TestTargetedQueue(t *testing.T) {
	t.Parallel()
	const delay = 100 * time.Millisecond
	t.Run("a request waits its delay", func(t *testing.T) {
		t.Parallel()
		queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, pending prometheus.Gauge, next func() served) {
			q.Request(scopeOf("a", true))
			if got := testutil.ToFloat64(pending); got != 1 {
				t.Errorf("pending gauge = %v with one request waiting", got)
			}
			checkServed(t, []served{{scopeOf("a", true), delay}}, next())
		})
	})
	t.Run("a negative delay does not wait", func(t *testing.T) {
		t.Parallel()
		queueTest(t, -1, 100, func(t *testing.T, q *targetedQueue, _ prometheus.Gauge, next func() served) {
			q.Request(scopeOf("a", true))
			checkServed(t, []served{{scopeOf("a", true), 0}}, next())
		})
	})
	t.Run("a pod's requests coalesce into one at the first one's time", func(t *testing.T) {
		t.Parallel()
		queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, pending prometheus.Gauge, next func() served) {
			q.Request(scopeOf("a", true))
			time.Sleep(30 * time.Millisecond)
			q.Request(scopeOf("a", true))
			time.Sleep(30 * time.Millisecond)
			q.Request(scopeOf("a", true))
			if got := testutil.ToFloat64(pending); got != 1 {
				t.Errorf("pending gauge = %v with one sandbox asked for three times", got)
			}
			checkServed(t, []served{{scopeOf("a", true), delay}}, next())
		})
	})
	for _, order := range [][]bool{{true, false, true}, {false, true}} {
		t.Run(fmt.Sprintf("a sandbox's own request lists the sandbox whatever its containers' ask (containers only: %v)", order), func(t *testing.T) {
			t.Parallel()
			queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, _ prometheus.Gauge, next func() served) {
				for _, containersOnly := range order {
					q.Request(scopeOf("a", containersOnly))
					time.Sleep(10 * time.Millisecond)
				}
				checkServed(t, []served{{scopeOf("a", false), delay}}, next())
			})
		})
	}
	t.Run("the oldest request goes first and a repeated one keeps its place", func(t *testing.T) {
		t.Parallel()
		queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, _ prometheus.Gauge, next func() served) {
			for _, id := range []string{"a", "b", "c", "a"} {
				q.Request(scopeOf(id, true))
				time.Sleep(10 * time.Millisecond)
			}
			want := []served{{scopeOf("a", true), delay}, {scopeOf("b", true), delay + 10*time.Millisecond}, {scopeOf("c", true), delay + 20*time.Millisecond}}
			checkServed(t, want, next(), next(), next())
		})
	})
	// The bug this guards against: a request that arrived while another was
	// being relisted went out as soon as that relist ended, before the rest
	// of its pod's events could join it.
	t.Run("a request waits its own delay even when asked for while another is relisted", func(t *testing.T) {
		t.Parallel()
		queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, _ prometheus.Gauge, next func() served) {
			q.Request(scopeOf("a", true))
			go func() {
				time.Sleep(150 * time.Millisecond)
				q.Request(scopeOf("b", true))
			}()
			first := next()
			time.Sleep(100 * time.Millisecond) // a's relist takes until 200 ms
			checkServed(t, []served{{scopeOf("a", true), delay}, {scopeOf("b", true), 150*time.Millisecond + delay}}, first, next())
		})
	})
	t.Run("a request after its sandbox was served waits anew", func(t *testing.T) {
		t.Parallel()
		queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, _ prometheus.Gauge, next func() served) {
			q.Request(scopeOf("a", true))
			first := next()
			q.Request(scopeOf("a", false))
			checkServed(t, []served{{scopeOf("a", true), delay}, {scopeOf("a", false), 2 * delay}}, first, next())
		})
	})
	t.Run("a storm goes out in a burst of half a second's worth, then at the rate, oldest first", func(t *testing.T) {
		t.Parallel()
		queueTest(t, delay, 10, func(t *testing.T, q *targetedQueue, pending prometheus.Gauge, next func() served) {
			var want []served
			for i := range 20 {
				s := scopeOf(fmt.Sprint("sb-", i), true)
				q.Request(s)
				at := delay // the burst of 5
				if i >= 5 {
					at += time.Duration(i-4) * 100 * time.Millisecond // then 10 a second
				}
				want = append(want, served{s, at})
			}
			if got := testutil.ToFloat64(pending); got != 20 {
				t.Errorf("pending gauge = %v with 20 sandboxes waiting", got)
			}
			var got []served
			for range 20 {
				got = append(got, next())
			}
			checkServed(t, want, got...)
		})
	})
	t.Run("Next gives up when its ctx ends and leaves the request waiting", func(t *testing.T) {
		t.Parallel()
		queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, pending prometheus.Gauge, next func() served) {
			q.Request(scopeOf("a", true))
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				time.Sleep(50 * time.Millisecond)
				cancel()
			}()
			if s, err := q.Next(ctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("Next with its ctx canceled = %+v, %v", s, err)
			}
			if got := testutil.ToFloat64(pending); got != 1 {
				t.Errorf("pending gauge = %v after Next gave up", got)
			}
			checkServed(t, []served{{scopeOf("a", true), delay}}, next())
		})
	})
}

func TestTargetedQueueTakeDueIfAtLeast(t *testing.T) {
	t.Parallel()
	const delay = 100 * time.Millisecond
	queueTest(t, delay, 100, func(t *testing.T, q *targetedQueue, pending prometheus.Gauge, next func() served) {
		// d and e are due later; c was asked for before a and b came due
		// sooner than it; b was asked for again and keeps its age.
		q.Request(scopeOf("c", true))
		q.RequestAfter(scopeOf("d", true), time.Hour)
		time.Sleep(10 * time.Millisecond)
		q.RequestAfter(scopeOf("a", true), 0)
		q.RequestAfter(scopeOf("b", true), 0)
		q.RequestAfter(scopeOf("e", true), time.Hour)
		q.Request(scopeOf("b", false))
		time.Sleep(delay)
		now := time.Now()
		if got := q.takeDueIfAtLeast(now, 4); got != nil {
			t.Errorf("takeDueIfAtLeast(4) with 3 due = %v; want nothing taken", got)
		}
		got := q.takeDueIfAtLeast(now, 3)
		want := []relistScope{scopeOf("a", true), scopeOf("b", false), scopeOf("c", true)}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(relistScope{})); diff != "" {
			t.Errorf("takeDueIfAtLeast(3) (-want +got):\n%s", diff)
		}
		if got := testutil.ToFloat64(pending); got != 2 {
			t.Errorf("pending gauge = %v with d and e left", got)
		}
		if got := q.takeDueIfAtLeast(now, 1); got != nil {
			t.Errorf("takeDueIfAtLeast(1) with none due = %v", got)
		}
		checkServed(t, []served{{scopeOf("d", true), time.Hour}, {scopeOf("e", true), 10*time.Millisecond + time.Hour}}, next(), next())
	})
}

// BenchmarkTargetedQueueStorm queues a storm's requests, one per sandbox,
// and takes them all: what the targeted relist goroutine does when a node's
// pods terminate faster than the rate limit lets it list them.
func BenchmarkTargetedQueueStorm(b *testing.B) {
	for _, n := range []int{100, 5000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			pending := prometheus.NewGauge(prometheus.GaugeOpts{Name: "pending"})
			q := newTargetedQueue(-1, 1e9, pending)
			ids := make([]relistScope, n)
			for i := range ids {
				ids[i] = scopeOf(fmt.Sprint("sb-", i), true)
			}
			b.ReportAllocs()
			for b.Loop() {
				for _, s := range ids {
					q.Request(s)
				}
				for range n {
					if _, ok := q.firstDue(); !ok {
						b.Fatal("queue empty early")
					}
					if _, ok := q.take(); !ok {
						b.Fatal("queue empty early")
					}
				}
			}
		})
	}
}
