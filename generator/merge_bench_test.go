package generator

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkMergePod measures the merge of one relist's view of a pod of
// five running containers and its sandbox into the pod's record:
// unchanged=true is the steady relist (the record is returned as it was,
// no event), unchanged=false a pod seen for the first time (a record and a
// ContainerStarted per container).
func BenchmarkMergePod(b *testing.B) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	obs := podObservation{pod: Pod{UID: "uid-1", Namespace: "ns", Name: "web-0"}, complete: true}
	obs.containers = append(obs.containers, sighting{info: Container{ID: "sb", Sandbox: true}, sandboxID: "sb", state: stateRunning, createdAt: at})
	for i := range 5 {
		obs.containers = append(obs.containers, sighting{
			info:      Container{ID: fmt.Sprintf("c%d", i), Name: fmt.Sprintf("app-%d", i), Image: "registry.example/app:1.0"},
			sandboxID: "sb", state: stateRunning, createdAt: at, startedAt: at,
		})
	}
	rec, evs := mergePod(nil, obs, SourceRelist, at)
	if len(evs) != 6 {
		b.Fatalf("first merge produced %d events, want 6", len(evs))
	}
	for _, unchanged := range []bool{true, false} {
		b.Run(fmt.Sprintf("unchanged=%v", unchanged), func(b *testing.B) {
			old := rec
			if !unchanged {
				old = nil
			}
			b.ReportAllocs()
			for b.Loop() {
				got, _ := mergePod(old, obs, SourceRelist, at.Add(time.Second))
				if unchanged && got != old {
					b.Fatal("a steady merge changed the record")
				}
			}
		})
	}
}
