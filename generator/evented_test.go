package generator

import (
	"testing"
	"time"
)

func TestMissedTransitions(t *testing.T) {
	t.Parallel()
	connected := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	relistAt := connected.Add(time.Minute)
	at := func(d time.Duration, typ LifecycleEventType, by Source) Event {
		return Event{Type: typ, Time: connected.Add(d), DetectedBy: by}
	}
	for _, tc := range []struct {
		name   string
		events []Event
		want   int
	}{
		{"a start the relist found well inside the connection counts", []Event{at(30*time.Second, ContainerStarted, SourceRelist)}, 1},
		{"a death the relist found counts", []Event{at(30*time.Second, ContainerDied, SourceRelist)}, 1},
		{"a removal does not count", []Event{at(30*time.Second, ContainerRemoved, SourceRelist)}, 0},
		{"what the stream reported does not count", []Event{at(30*time.Second, ContainerStarted, SourceEvented)}, 0},
		{"a transition within the grace after the connection opened does not count", []Event{at(missedGrace, ContainerStarted, SourceRelist)}, 0},
		{"a transition within the grace before the relist does not count", []Event{at(time.Minute-missedGrace, ContainerStarted, SourceRelist)}, 0},
		{"a transition before the connection does not count", []Event{at(-time.Second, ContainerStarted, SourceRelist)}, 0},
		{"each counted transition counts once", []Event{
			at(10*time.Second, ContainerStarted, SourceRelist),
			at(20*time.Second, ContainerDied, SourceRelist),
			at(20*time.Second, ContainerRemoved, SourceRelist),
		}, 2},
		{"no events count nothing", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := missedTransitions(tc.events, connected, relistAt); got != tc.want {
				t.Errorf("missedTransitions = %d, want %d", got, tc.want)
			}
		})
	}
}
