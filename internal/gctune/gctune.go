// Package gctune sets the garbage collector's target for a process that
// runs one bridge: low through the bridge's start-up, its memory peak, and
// then a steady one that depends on the mode and on the heap the start-up
// left. The target is process-wide, so the process's owner (cmd) sets it,
// never the bridge package: a benchmark or a test that runs bridges in its
// own process keeps its own collector.
//
// Why these targets: the first relist is the bridge's memory peak. It lists
// the whole node (the listing's frames and items, about 10 MB at 1,000 pods
// and 5,000 containers), asks every container's status, and publishes and
// writes through an event for each, most of it garbage soon after. With
// GOGC=100 the heap grows to twice what is live at that moment: the peak
// RSS was 64-77 MiB at 1,000/5,000 against a 64 MiB target; 55-77 with 25
// for the start-up alone, 51-60 with 10. Generic mode lists the whole node
// every second: on a big node (5,000/20,000) its steady relists at 100
// reached 184 MiB, and 126-157 MiB at 50, and at 1,000/5,000 they made its
// peak at 100 (up to 64 MiB); on a small one (110/330) 50 cost 1.2-1.6x the
// bare relist loop's CPU, 100 0.8-0.9x (pleg-bench, BENCHMARKS.md), so the
// live heap after the first relist decides. The modes that follow events
// keep 100: under churn a lower target costs CPU on every transition.
package gctune

import (
	"os"
	"runtime/debug"
	"runtime/metrics"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

const (
	// StartupPercent is the target through the start-up.
	StartupPercent = 10
	// SteadyPercent is the steady target in the modes that follow events:
	// Go's own default.
	SteadyPercent = 100
	// GenericPercent is the steady target in generic mode on a node whose
	// live heap after the start-up is at least GenericBigHeap.
	GenericPercent = 50
	// GenericBigHeap is the live heap from which generic mode takes
	// GenericPercent: about 500 pods and 2,500 containers. Below it
	// (110/330 holds 3-5 MiB), the relist's garbage is small and a lower
	// target would cost more collections than it saves memory.
	GenericBigHeap = 8 << 20
)

// Steady returns the steady target for a bridge in mode whose live heap
// after the start-up is liveHeap bytes.
func Steady(mode generator.Mode, liveHeap uint64) int {
	if mode == generator.ModeGeneric && liveHeap >= GenericBigHeap {
		return GenericPercent
	}
	return SteadyPercent
}

// Tuner sets the targets of one bridge's process. Its methods are safe to
// call from any one goroutine at a time (the bridge calls StartupOver from
// its own).
type Tuner struct {
	mode generator.Mode
	// set sets a target; off (GOGC chose one) leaves it alone.
	set func(int)
	off bool
}

// Start sets the start-up target and returns the Tuner that sets the
// steady one, unless the GOGC environment variable chose a target: then it
// changes nothing, now or later.
func Start(mode generator.Mode) *Tuner {
	return start(mode, os.Getenv("GOGC") != "", func(p int) { debug.SetGCPercent(p) })
}

func start(mode generator.Mode, gogcSet bool, set func(int)) *Tuner {
	t := &Tuner{mode: mode, set: set, off: gogcSet}
	if !t.off {
		t.set(StartupPercent)
	}
	return t
}

// StartupOver sets the steady target, from the heap the start-up left
// live. It is the bridge's Options.StartupOver.
func (t *Tuner) StartupOver() {
	if !t.off {
		t.set(Steady(t.mode, liveHeap()))
	}
}

// Stop gives the process Go's own target back.
func (t *Tuner) Stop() {
	if !t.off {
		t.set(SteadyPercent)
	}
}

// liveHeap returns the heap the last garbage collection found live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
