package latencybench

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// trackerOutcome is what a test reads of a tracker once the driver finished.
type trackerOutcome struct {
	Expected, Acked, Duplicates, ByRelist int
	Latencies                             []time.Duration
	Stages                                map[string][]time.Duration
	AllAcked                              bool
}

func TestTrackerMatchesInAnyOrder(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	at := func(µs int) time.Time { return t0.Add(time.Duration(µs) * time.Microsecond) }
	us := func(µs ...int) []time.Duration {
		var ds []time.Duration
		for _, n := range µs {
			ds = append(ds, time.Duration(n)*time.Microsecond)
		}
		return ds
	}
	a := transition{"c1", generator.ContainerStarted}
	b := transition{"c2", generator.ContainerDied}

	type step func(*testing.T, *tracker)
	record := func(tr transition, when time.Time, measured bool) step {
		return func(t *testing.T, k *tracker) {
			if err := k.record(tr, when, measured); err != nil {
				t.Fatalf("record(%v) = %v", tr, err)
			}
		}
	}
	ack := func(tr transition, source generator.Source, when time.Time) step {
		return func(_ *testing.T, k *tracker) { k.ack(tr, source, when) }
	}
	stamp := func(tr transition, set func(*expectation, time.Time), when time.Time) step {
		return func(_ *testing.T, k *tracker) { k.stamp(tr, when, set) }
	}
	withdrawn := func(tr transition) step {
		return func(t *testing.T, k *tracker) {
			if err := k.track(tr, true, func() error { return errors.New("the runtime refused") }); err == nil {
				t.Fatal("track of a failing call returned nil")
			}
		}
	}
	// The stamps of one event, in the order the bridge makes them.
	stamps := []step{
		stamp(a, setReceived, at(100)), stamp(a, setHanded, at(150)), stamp(a, setQueued, at(170)),
	}
	stampsTimed := map[string][]time.Duration{
		StageStream: us(100), StageDetect: us(50), StageEncode: us(20), StageAck: us(830),
	}
	then := func(steps ...[]step) []step {
		var all []step
		for _, s := range steps {
			all = append(all, s...)
		}
		return all
	}

	tests := []struct {
		name  string
		steps []step
		want  trackerOutcome
	}{
		{
			name:  "an ack after the record settles the transition",
			steps: []step{record(a, at(0), true), ack(a, generator.SourceEvented, at(1000))},
			want:  trackerOutcome{Expected: 1, Acked: 1, Latencies: us(1000), AllAcked: true},
		},
		{
			name:  "an ack before the record is kept until the record comes",
			steps: []step{ack(a, generator.SourceEvented, at(1000)), record(a, at(0), true)},
			want:  trackerOutcome{Expected: 1, Acked: 1, Latencies: us(1000), AllAcked: true},
		},
		{
			name:  "stage stamps before the record are kept",
			steps: then(stamps, []step{record(a, at(0), true), ack(a, generator.SourceEvented, at(1000))}),
			want:  trackerOutcome{Expected: 1, Acked: 1, Latencies: us(1000), Stages: stampsTimed, AllAcked: true},
		},
		{
			name:  "stage stamps and the ack before the record are kept",
			steps: then(stamps, []step{ack(a, generator.SourceEvented, at(1000)), record(a, at(0), true)}),
			want:  trackerOutcome{Expected: 1, Acked: 1, Latencies: us(1000), Stages: stampsTimed, AllAcked: true},
		},
		{
			name: "a stamp after an early ack is ignored, as after any ack",
			steps: []step{
				stamp(a, setHanded, at(150)), ack(a, generator.SourceEvented, at(1000)),
				stamp(a, setQueued, at(1200)), record(a, at(0), true),
			},
			want: trackerOutcome{Expected: 1, Acked: 1, Latencies: us(1000), AllAcked: true,
				Stages: map[string][]time.Duration{StageDetect: us(150), StageEncode: us(850), StageAck: us(0)}},
		},
		{
			name:  "a withdrawn transition and its ack are not counted",
			steps: []step{withdrawn(a), ack(a, generator.SourceEvented, at(1000))},
			want:  trackerOutcome{AllAcked: true},
		},
		{
			name:  "a duplicate ack after the record is counted",
			steps: []step{record(a, at(0), true), ack(a, generator.SourceEvented, at(1000)), ack(a, generator.SourceRelist, at(5000))},
			want:  trackerOutcome{Expected: 1, Acked: 1, Duplicates: 1, Latencies: us(1000), AllAcked: true},
		},
		{
			name:  "a duplicate ack before the record is counted once the record comes",
			steps: []step{ack(a, generator.SourceEvented, at(1000)), ack(a, generator.SourceRelist, at(5000)), record(a, at(0), true)},
			want:  trackerOutcome{Expected: 1, Acked: 1, Duplicates: 1, Latencies: us(1000), AllAcked: true},
		},
		{
			name:  "acks of what the driver never reported, such as the setup, are not counted",
			steps: []step{ack(b, generator.SourceRelist, at(1000)), ack(b, generator.SourceRelist, at(2000))},
			want:  trackerOutcome{AllAcked: true},
		},
		{
			name:  "an event a relist detected counts as such when its ack comes first",
			steps: []step{ack(a, generator.SourceRelist, at(900_000)), record(a, at(0), true)},
			want:  trackerOutcome{Expected: 1, Acked: 1, ByRelist: 1, Latencies: us(900_000), AllAcked: true},
		},
		{
			name:  "a warmup transition is matched but not timed",
			steps: []step{ack(a, generator.SourceEvented, at(1000)), record(a, at(0), false), ack(a, generator.SourceEvented, at(2000))},
			want:  trackerOutcome{Duplicates: 1, AllAcked: true},
		},
		{
			name:  "a transition without an ack is outstanding",
			steps: []step{record(a, at(0), true), record(b, at(10), true), ack(b, generator.SourceEvented, at(1000))},
			want:  trackerOutcome{Expected: 2, Acked: 1, Latencies: us(990)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k := newTracker(0)
			for _, s := range tt.steps {
				s(t, k)
			}
			k.finish()
			r := k.result(ModeEvented, paced{})
			got := trackerOutcome{
				Expected: r.Expected, Acked: r.Acked, Duplicates: r.Duplicates, ByRelist: r.ByRelist,
				Latencies: k.latencies, Stages: k.stages,
			}
			select {
			case <-k.allAcked:
				got.AllAcked = true
			default:
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTrackerRefusesATransitionReportedTwice(t *testing.T) {
	t.Parallel()
	tr := transition{"c1", generator.ContainerStarted}
	for _, acked := range []bool{false, true} {
		k := newTracker(0)
		if err := k.record(tr, time.Unix(1, 0), true); err != nil {
			t.Fatal(err)
		}
		if acked {
			k.ack(tr, generator.SourceEvented, time.Unix(2, 0))
		}
		if err := k.record(tr, time.Unix(3, 0), true); !errors.Is(err, errReportedTwice) {
			t.Errorf("acked %v: second record = %v, want errReportedTwice", acked, err)
		}
		if r := k.result(ModeEvented, paced{}); r.Expected != 1 {
			t.Errorf("acked %v: %d expected after the refused record, want 1", acked, r.Expected)
		}
	}
}
