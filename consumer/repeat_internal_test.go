package consumer

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// step is one event checked against a recentIDs: its id, sequence and
// storage time (seconds after t0), and whether it must be taken for a
// repeat of first.
type step struct {
	id     string
	seq    uint64
	at     int
	repeat bool
	first  uint64
}

func TestRecentIDs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		window time.Duration
		max    int
		steps  []step
	}{{
		name: "an id delivered before at another sequence is a repeat", window: time.Minute, max: 10,
		steps: []step{{id: "a", seq: 1}, {id: "b", seq: 2}, {id: "a", seq: 3, repeat: true, first: 1}},
	}, {
		name: "a repeat keeps its first sequence", window: time.Minute, max: 10,
		steps: []step{{id: "a", seq: 1}, {id: "a", seq: 2, repeat: true, first: 1}, {id: "a", seq: 3, repeat: true, first: 1}},
	}, {
		name: "an id is forgotten once an event stored more than the window after it is checked", window: time.Minute, max: 10,
		steps: []step{{id: "a", seq: 1, at: 0}, {id: "b", seq: 2, at: 30}, {id: "a", seq: 3, at: 61}, {id: "b", seq: 4, at: 62, repeat: true, first: 2}},
	}, {
		name: "an id stored exactly the window before is still known", window: time.Minute, max: 10,
		steps: []step{{id: "a", seq: 1, at: 0}, {id: "a", seq: 2, at: 60, repeat: true, first: 1}},
	}, {
		name: "beyond max ids the oldest is forgotten first", window: time.Hour, max: 2,
		steps: []step{{id: "a", seq: 1}, {id: "b", seq: 2}, {id: "c", seq: 3}, {id: "a", seq: 4}, {id: "c", seq: 5, repeat: true, first: 3}},
	}, {
		name: "the queue keeps its order when it grows past its first size", window: time.Hour, max: 100,
		steps: func() []step {
			var s []step
			for i := range 70 {
				s = append(s, step{id: fmt.Sprint(i), seq: uint64(i + 1)})
			}
			return append(s, step{id: "0", seq: 71, repeat: true, first: 1}, step{id: "69", seq: 72, repeat: true, first: 70})
		}(),
	}} {
		// As Subscribe checks and records at once, and as a durable
		// group's member checks, then records once the handler is done.
		for _, record := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s (record at check %v)", tc.name, record), func(t *testing.T) {
				r := RepeatOptions{Window: tc.window, MaxIDs: tc.max}.newRecent()
				for i, s := range tc.steps {
					at := t0.Add(time.Duration(s.at) * time.Second)
					first, repeat := r.check(s.id, s.seq, at, record)
					if repeat != s.repeat || first != s.first && s.repeat {
						t.Fatalf("step %d (%s at %d, %ds): check = %d, %v; want %d, %v", i, s.id, s.seq, s.at, first, repeat, s.first, s.repeat)
					}
					if !repeat && !record {
						r.add(s.id, s.seq, at)
					}
					if n := r.size(); n > tc.max {
						t.Fatalf("step %d: holds %d ids, more than max %d", i, n, tc.max)
					}
				}
			})
		}
	}
}

func TestTheSameSequenceAgainIsARepeatUnlessAGroupRedeliversIt(t *testing.T) {
	t.Parallel()
	first := Event{ID: "a", Sequence: 1}
	for _, tc := range []struct {
		name       string
		redelivery bool
		repeat     bool
	}{
		{name: "a group's retry at the same sequence is not a repeat", redelivery: true},
		{name: "the event copied again at its sequence is a repeat", repeat: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := RepeatOptions{}.newRecent()
			r.add(first.ID, first.Sequence, t0)
			if got := (RepeatOptions{}).repeat(r, first, t0.Add(time.Second), tc.redelivery); got != tc.repeat {
				t.Errorf("repeat = %v, want %v", got, tc.repeat)
			}
		})
	}
	// Subscribe reads a sequence again only after a rollback: the event it
	// delivered there, stored there again, is a repeat.
	ordered := RepeatOptions{}.newRecent()
	ordered.check("a", 1, t0, true)
	if first, repeat := ordered.check("a", 1, t0.Add(time.Second), true); !repeat || first != 1 {
		t.Errorf("Subscribe's check of the same id at the same sequence = %d, %v; want 1, true", first, repeat)
	}
}

func TestRepeatsOffChecksNothing(t *testing.T) {
	t.Parallel()
	r := RepeatOptions{Off: true}.newRecent()
	r.add("a", 1, t0)
	if _, repeat := r.check("a", 2, t0, true); repeat {
		t.Error("with Off, an id delivered before is taken for a repeat")
	}
}

func TestRepeatOptionsDefaults(t *testing.T) {
	t.Parallel()
	r := RepeatOptions{}.newRecent()
	if r.window != DefaultRepeatWindow || r.max != DefaultRepeatIDs {
		t.Errorf("zero RepeatOptions: window %s, max %d; want %s, %d", r.window, r.max, DefaultRepeatWindow, DefaultRepeatIDs)
	}
}

// BenchmarkRecentIDsFull reports the memory a full set of the default
// size costs, per id: the figure RepeatOptions and docs/consuming.md give.
func BenchmarkRecentIDsFull(b *testing.B) {
	ids := make([]string, DefaultRepeatIDs)
	for i := range ids {
		// CloudEvent ids are UUIDs.
		ids[i] = fmt.Sprintf("%08x-0000-5000-8000-%012x", i, i)
	}
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := RepeatOptions{}.newRecent()
		for i, id := range ids {
			r.add(id, uint64(i+1), t0.Add(time.Duration(i)*time.Microsecond))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(r.size()), "bytes/id")
		runtime.KeepAlive(r)
	}
}

// BenchmarkRecentIDsCheck is the cost of checking and recording one event
// in a set that holds a window's worth, as Subscribe and Replay do.
func BenchmarkRecentIDsCheck(b *testing.B) {
	r := RepeatOptions{MaxIDs: 1 << 16}.newRecent()
	ids := make([]string, 1<<17)
	for i := range ids {
		ids[i] = fmt.Sprintf("%08x-0000-5000-8000-%012x", i, i)
	}
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		at := t0.Add(time.Duration(i) * time.Millisecond)
		r.check(id, uint64(i+1), at, true)
		i++
	}
}
