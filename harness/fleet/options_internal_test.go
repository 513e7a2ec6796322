package fleet

import (
	"strings"
	"testing"
	"time"
)

func TestOptions(t *testing.T) {
	base := Options{Dir: "/tmp/x", ChildCommand: []string{"pleg-bridge", "fleet", "child"}}
	t.Run("defaults give half a transition per node per second and faults in schedule order", func(t *testing.T) {
		o := base
		o.Nodes = 200
		o.Faults = []string{FaultBridgeKill, FaultServerRestart}
		got, err := o.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if got.Rate != 100 || got.Procs != DefaultProcs || got.Faults[0] != FaultServerRestart {
			t.Errorf("rate %v, procs %d, faults %v", got.Rate, got.Procs, got.Faults)
		}
	})
	t.Run("more processes than nodes are cut to one node each", func(t *testing.T) {
		o := base
		o.Nodes, o.Procs = 3, 8
		got, err := o.withDefaults()
		if err != nil || got.Procs != 3 {
			t.Errorf("procs %d, err %v; want 3", got.Procs, err)
		}
	})
	t.Run("a bridge kill takes a tenth of the processes, rounded up, at least one", func(t *testing.T) {
		for procs, want := range map[int]int{1: 1, 4: 1, 10: 1, 11: 2, 40: 4} {
			o, _ := Options{Nodes: 100, Procs: procs, Dir: "/d", ChildCommand: []string{"x"}}.withDefaults()
			if got := o.killed(); got != want {
				t.Errorf("%d processes: kill %d, want %d", procs, got, want)
			}
		}
	})
	t.Run("errors name the flag and the value at fault, all of them", func(t *testing.T) {
		o := base
		o.KillFraction, o.Faults, o.Outage = 2, []string{"meteor"}, -time.Second
		_, err := o.withDefaults()
		for _, want := range []string{"--kill-fraction=2", `unknown fault "meteor"`, "--outage=-1s"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v, want it to contain %q", err, want)
			}
		}
	})
}

func TestPercentile(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if got := percentile(d, 0.5); got != 6 {
		t.Errorf("p50 = %v, want 6 (the nearest rank, rounded up)", got)
	}
	if got := percentile(d, 0.99); got != 10 {
		t.Errorf("p99 = %v, want 10", got)
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
}
