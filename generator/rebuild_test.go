package generator

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRebuildMakesTheEventTheMergeProduced follows containers through their
// lives, holds every event the merge produces (as when the sink is full),
// and rebuilds each from the final record, which knows more by then (it may
// have exited, or be gone): the backfill must send what would have been
// sent.
func TestRebuildMakesTheEventTheMergeProduced(t *testing.T) {
	t.Parallel()
	type obs struct {
		s   sighting
		src Source
		at  time.Time
	}
	sandbox := func(state cstate, createdAt time.Time) sighting {
		return sighting{info: Container{ID: "sb", Sandbox: true}, sandboxID: "sb", state: state, createdAt: createdAt}
	}
	tests := []struct {
		name string
		life []obs
	}{
		{"a container seen running, exited and gone", []obs{
			{running("c", at(1)), SourceRelist, at(2)},
			{exited("c", at(1), at(5), 3), SourceEvented, at(5)},
			{gone("c"), SourceRelist, at(9)},
		}},
		{"a container running without started_at that exited without it too", []obs{
			{running("c", time.Time{}), SourceRelist, at(2)},
			{exited("c", time.Time{}, at(5), 1), SourceRelist, at(6)},
		}},
		{"a container first seen exited gets its start synthesized", []obs{
			{exited("c", at(1), at(3), 0), SourceRelist, at(4)},
			{gone("c"), SourceEvented, at(7)},
		}},
		{"a container seen running and then found gone dies unknown", []obs{
			{running("c", at(1)), SourceEvented, at(1)},
			{gone("c"), SourceRelist, at(8)},
		}},
		{"a sandbox that went NOTREADY and away", []obs{
			{sandbox(stateRunning, at(1)), SourceRelist, at(2)},
			{sandbox(stateExited, at(1)), SourceRelist, at(4)},
			{gone("sb"), SourceRelist, at(6)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var rec *containerRecord
			var produced []Event
			for _, o := range tt.life {
				n, evs := mergeContainer(rec, &o.s, testPod, o.src, o.at)
				if n != nil {
					rec = n
				}
				produced = append(produced, evs...)
			}
			if len(produced) == 0 {
				t.Fatal("the life produced no event")
			}
			held := *rec
			held.held = &[3]heldEvent{}
			for _, ev := range produced {
				held.unsent |= bit(ev.Type)
				held.held[typeIndex(ev.Type)] = heldEvent{at: ev.ObservedAt, src: ev.DetectedBy}
			}
			var rebuilt []Event
			for _, ev := range produced {
				rebuilt = append(rebuilt, held.rebuild(ev.Type, testPod))
			}
			if diff := cmp.Diff(produced, rebuilt); diff != "" {
				t.Errorf("rebuilt events (-produced +rebuilt):\n%s", diff)
			}
		})
	}
}
