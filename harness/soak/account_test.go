package soak

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestAccount(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	windows := []Window{
		{Name: "baseline", From: at(0), To: at(10)},
		{Name: "nats-outage", From: at(10), To: at(20)},
		{Name: "recovery", From: at(20), To: at(30)},
	}
	made := func(id, typ string, s float64) Transition {
		return Transition{ContainerID: id, PodUID: "pod-" + id, Type: typ, At: at(s)}
	}
	stored := func(seq uint64, id, typ string, s float64) Stored {
		return Stored{Seq: seq, ID: id + "/" + typ, ContainerID: id, PodUID: "pod-" + id, Type: typ, StoredAt: at(s)}
	}
	// Container a lives in the baseline, b during the outage, c in the
	// recovery.
	life := []Transition{
		made("a", ContainerStarted, 1), made("a", ContainerDied, 2), made("a", ContainerRemoved, 3),
		made("b", ContainerStarted, 11), made("b", ContainerDied, 12), made("b", ContainerRemoved, 13),
		made("c", ContainerStarted, 21),
	}
	delivered := []Stored{
		stored(1, "a", ContainerStarted, 1.01), stored(2, "a", ContainerDied, 2.01), stored(3, "a", ContainerRemoved, 3.01),
		stored(4, "b", ContainerStarted, 16), stored(5, "b", ContainerDied, 16), stored(6, "b", ContainerRemoved, 16),
		stored(7, "c", ContainerStarted, 21.5),
	}
	results := func(baseline, outage, recovery WindowResult) []WindowResult {
		baseline.Window, outage.Window, recovery.Window = windows[0], windows[1], windows[2]
		return []WindowResult{baseline, outage, recovery}
	}

	tests := []struct {
		name   string
		made   []Transition
		stored []Stored
		health []HealthFailure
		want   Accounting
	}{
		{
			name:   "every transition stored once in order is found, with the delay of the slowest",
			made:   life,
			stored: delivered,
			want: Accounting{
				Windows: results(
					WindowResult{Expected: 3, Found: 3, MaxDelay: 10 * time.Millisecond},
					WindowResult{Expected: 3, Found: 3, MaxDelay: 5 * time.Second},
					WindowResult{Expected: 1, Found: 1, MaxDelay: 500 * time.Millisecond},
				),
				Total: WindowResult{Window: Window{Name: "total", From: at(0), To: at(30)}, Expected: 7, Found: 7, MaxDelay: 5 * time.Second},
			},
		},
		{
			name:   "a transition never stored is missing in the window it was made in",
			made:   life,
			stored: append(append([]Stored{}, delivered[:4]...), delivered[5:]...), // b's Died lost
			want: Accounting{
				Windows: results(
					WindowResult{Expected: 3, Found: 3, MaxDelay: 10 * time.Millisecond},
					WindowResult{Expected: 3, Found: 2, Missing: 1, MaxDelay: 5 * time.Second},
					WindowResult{Expected: 1, Found: 1, MaxDelay: 500 * time.Millisecond},
				),
				Total:   WindowResult{Window: Window{Name: "total", From: at(0), To: at(30)}, Expected: 7, Found: 6, Missing: 1, MaxDelay: 5 * time.Second},
				Missing: []Finding{{Transition: life[4], Window: "nats-outage"}},
			},
		},
		{
			name:   "a transition stored twice is found and duplicated, whatever lies between",
			made:   life,
			stored: append(append([]Stored{}, delivered...), stored(8, "b", ContainerDied, 25)),
			want: Accounting{
				Windows: results(
					WindowResult{Expected: 3, Found: 3, MaxDelay: 10 * time.Millisecond},
					WindowResult{Expected: 3, Found: 3, Duplicated: 1, MaxDelay: 5 * time.Second},
					WindowResult{Expected: 1, Found: 1, MaxDelay: 500 * time.Millisecond},
				),
				Total:      WindowResult{Window: Window{Name: "total", From: at(0), To: at(30)}, Expected: 7, Found: 7, Duplicated: 1, MaxDelay: 5 * time.Second},
				Duplicated: []Finding{{Transition: life[4], Window: "nats-outage", Seqs: []uint64{5, 8}}},
			},
		},
		{
			name: "Died stored before Started, and Removed before both, are out of order",
			made: life[3:6],
			stored: []Stored{
				stored(4, "b", ContainerRemoved, 16), stored(5, "b", ContainerDied, 16), stored(6, "b", ContainerStarted, 16),
			},
			want: Accounting{
				Windows: results(
					WindowResult{},
					WindowResult{Expected: 3, Found: 3, OutOfOrder: 2, MaxDelay: 5 * time.Second},
					WindowResult{},
				),
				Total: WindowResult{Window: Window{Name: "total", From: at(0), To: at(30)}, Expected: 3, Found: 3, OutOfOrder: 2, MaxDelay: 5 * time.Second},
				OutOfOrder: []Finding{
					{Transition: life[4], Window: "nats-outage", Seqs: []uint64{5}},
					{Transition: life[5], Window: "nats-outage", Seqs: []uint64{4}},
				},
			},
		},
		{
			name: "a late duplicate of an earlier step does not make the later steps out of order",
			made: life[:3],
			stored: []Stored{
				stored(1, "a", ContainerStarted, 1), stored(2, "a", ContainerDied, 2), stored(3, "a", ContainerStarted, 3),
				stored(4, "a", ContainerRemoved, 3),
			},
			want: Accounting{
				Windows: results(
					WindowResult{Expected: 3, Found: 3, Duplicated: 1},
					WindowResult{},
					WindowResult{},
				),
				Total:      WindowResult{Window: Window{Name: "total", From: at(0), To: at(30)}, Expected: 3, Found: 3, Duplicated: 1},
				Duplicated: []Finding{{Transition: life[0], Window: "baseline", Seqs: []uint64{1, 3}}},
			},
		},
		{
			name:   "an event of a transition never made is unexpected, and messages are taken in stream order",
			made:   life[6:],
			stored: []Stored{stored(9, "z", ContainerDied, 25), stored(7, "c", ContainerStarted, 21.5)},
			want: Accounting{
				Windows: results(
					WindowResult{},
					WindowResult{},
					WindowResult{Expected: 1, Found: 1, MaxDelay: 500 * time.Millisecond},
				),
				Total:      WindowResult{Window: Window{Name: "total", From: at(0), To: at(30)}, Expected: 1, Found: 1, MaxDelay: 500 * time.Millisecond},
				Unexpected: []Stored{stored(9, "z", ContainerDied, 25)},
			},
		},
		{
			name:   "transitions and health failures outside all windows count in the nearest",
			made:   []Transition{made("a", ContainerStarted, -1), made("c", ContainerStarted, 31)},
			stored: []Stored{stored(1, "a", ContainerStarted, 0), stored(2, "c", ContainerStarted, 32)},
			health: []HealthFailure{{At: at(15), Detail: "500"}, {At: at(40), Detail: "500"}},
			want: Accounting{
				Windows: results(
					WindowResult{Expected: 1, Found: 1, MaxDelay: time.Second},
					WindowResult{HealthFailures: 1},
					WindowResult{Expected: 1, Found: 1, MaxDelay: time.Second, HealthFailures: 1},
				),
				Total:  WindowResult{Window: Window{Name: "total", From: at(0), To: at(30)}, Expected: 2, Found: 2, MaxDelay: time.Second, HealthFailures: 2},
				Health: []HealthFailure{{At: at(15), Detail: "500"}, {At: at(40), Detail: "500"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := account(windows, tt.made, tt.stored, tt.health, nil)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("account (-want +got):\n%s", diff)
			}
			wantFailed := tt.want.Total.Missing+tt.want.Total.Duplicated+tt.want.Total.OutOfOrder+
				len(tt.want.Unexpected)+len(tt.want.Health) > 0
			if got.Failed() != wantFailed {
				t.Errorf("Failed() = %v, want %v", got.Failed(), wantFailed)
			}
		})
	}
}

func TestWindowOf(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	windows := []Window{
		{Name: "a", From: t0, To: t0.Add(time.Second)},
		{Name: "b", From: t0.Add(time.Second), To: t0.Add(2 * time.Second)},
		{Name: "c", From: t0.Add(3 * time.Second), To: t0.Add(4 * time.Second)},
	}
	tests := []struct {
		name string
		at   time.Time
		want int
	}{
		{"a time before all windows is in the first", t0.Add(-time.Hour), 0},
		{"a window's start is in it", t0, 0},
		{"a window's end is in the next", t0.Add(time.Second), 1},
		{"a time in a gap is in the later window", t0.Add(2500 * time.Millisecond), 2},
		{"a time after all windows is in the last", t0.Add(time.Hour), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := windowOf(windows, tt.at); got != tt.want {
				t.Errorf("windowOf(%v) = %d, want %d", tt.at.Sub(t0), got, tt.want)
			}
		})
	}
	if got := windowOf(nil, t0); got != -1 {
		t.Errorf("windowOf without windows = %d, want -1", got)
	}
}

// TestAccountUnobservable: with the bridge dead from 10 s to 14 s on a
// runtime that keeps no event, a container whose whole life fell in that
// time could not be seen by any bridge and is unobservable; one that
// started before the bridge died, or was still there when it came back,
// is missing if not stored, and so is the rest of one whose start (or any
// step) is in the stream, from that step on, whenever it lived.
func TestAccountUnobservable(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	windows := []Window{{Name: "bridge-kill", From: at(0), To: at(30)}}
	blind := []Window{{Name: "bridge dead", From: at(10), To: at(14)}}
	life := func(id string, from, to float64) []Transition {
		return []Transition{
			{ContainerID: id, Type: ContainerStarted, At: at(from)},
			{ContainerID: id, Type: ContainerDied, At: at((from + to) / 2)},
			{ContainerID: id, Type: ContainerRemoved, At: at(to)},
		}
	}
	var made []Transition
	made = append(made, life("inside", 11, 13)...)                                            // whole life while dead
	made = append(made, life("before", 9, 12)...)                                             // started while a bridge ran
	made = append(made, life("after", 12, 15)...)                                             // still there when it came back
	made = append(made, Transition{ContainerID: "alive", Type: ContainerStarted, At: at(11)}) // never removed
	// Their whole lives fell in the blind time too, but the stream holds
	// one of their transitions: a bridge saw them from there on. seen's
	// start is stored, so its end is due; late was first seen exited (its
	// Died is stored), so its start stays excused and its removal is due.
	made = append(made, life("seen", 10.05, 13)...)
	made = append(made, life("late", 10.5, 13)...)
	// A sandbox started and stopped while no bridge ran, and removed once
	// one ran again: first seen NOTREADY, its Died is stored and its start
	// is excused; its removal is due. One started before the bridge died
	// is not excused.
	made = append(made, life("stopped", 11, 17)...)
	made = append(made, life("earlier", 9, 17)...)
	stored := []Stored{
		{ContainerID: "seen", Type: ContainerStarted, Seq: 1, StoredAt: at(10.06)},
		{ContainerID: "late", Type: ContainerDied, Seq: 2, StoredAt: at(14.5)},
		{ContainerID: "stopped", Type: ContainerDied, Seq: 3, StoredAt: at(14.5)},
		{ContainerID: "earlier", Type: ContainerDied, Seq: 4, StoredAt: at(14.5)},
	}
	a := account(windows, made, stored, nil, blind)
	var unobservable, missing []string
	for _, f := range a.Unobservable {
		unobservable = append(unobservable, f.ContainerID+" "+f.Type)
	}
	for _, f := range a.Missing {
		missing = append(missing, f.ContainerID)
	}
	if want := []string{"inside ContainerStarted", "inside ContainerDied", "inside ContainerRemoved", "late ContainerStarted", "stopped ContainerStarted"}; !slices.Equal(unobservable, want) {
		t.Errorf("unobservable %v, want %v", unobservable, want)
	}
	if got := strings.Join(slices.Compact(missing), ","); got != "before,after,alive,seen,late,stopped,earlier" {
		t.Errorf("missing %s, want before, after, alive, seen, late, stopped and earlier", got)
	}
	if !a.Failed() || a.Total.Unobservable != 5 || a.Total.Missing != 13 {
		t.Errorf("failed %v, unobservable %d, missing %d", a.Failed(), a.Total.Unobservable, a.Total.Missing)
	}
	if b := account(windows, life("inside", 11, 13), nil, nil, blind); b.Failed() {
		t.Errorf("only unobservable transitions fail the soak: %+v", b.Total)
	}
}
