package bridge

import (
	"testing"
	"time"
)

// TestTheStartUpEndsWhenTheFirstRelistsEventsHaveSettled: the start-up is
// over once as many events have settled as were recorded when the first
// relist was merged, however many more are pending by then (a node whose
// pods churn from the start), or startupLimit after that merge.
func TestTheStartUpEndsWhenTheFirstRelistsEventsHaveSettled(t *testing.T) {
	type look struct {
		after             time.Duration
		synced            bool
		recorded, settled uint64
		over              bool
	}
	t0 := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name  string
		looks []look
	}{
		{"churn from the start", []look{
			{0, false, 40, 0, false},
			{100 * time.Millisecond, true, 120, 30, false}, // the first relist's events are recorded by now
			{200 * time.Millisecond, true, 900, 119, false},
			{300 * time.Millisecond, true, 1700, 120, true}, // 1,580 pending, and over
		}},
		{"NATS away: over at the limit", []look{
			{0, true, 50, 0, false},
			{startupLimit, true, 50, 0, false},
			{startupLimit + time.Millisecond, true, 50, 0, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s startup
			for i, l := range tc.looks {
				if got := s.over(t0.Add(l.after), l.synced, l.recorded, l.settled); got != l.over {
					t.Errorf("look %d (%+v): over = %v, want %v", i, l, got, l.over)
				}
			}
		})
	}
}
