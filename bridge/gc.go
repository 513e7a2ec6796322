package bridge

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Defaults of Options.StartupGCPercent and Options.GCPercent.
const (
	DefaultStartupGCPercent = 10
	// DefaultGCPercent is the steady target in the modes that follow
	// events: Go's own default.
	DefaultGCPercent = 100
	// DefaultGenericGCPercent is the steady target in generic mode, which
	// lists the whole node every second, on a node whose live heap after
	// the first relist is at least genericBigHeap.
	DefaultGenericGCPercent = 50
)

// genericBigHeap is the live heap from which generic mode takes
// DefaultGenericGCPercent: about 500 pods and 2,500 containers. Below it
// (110/330 holds 3-5 MiB), the relist's garbage is small and a lower
// target would cost more collections than it saves memory.
const genericBigHeap = 8 << 20

// startupGCLimit bounds how long the start-up target holds once the first
// relist is merged, when its events cannot all be delivered (NATS down at
// the start).
const startupGCLimit = 30 * time.Second

// gcPercent returns the steady garbage collection target of o (defaults
// applied) for a live heap of liveHeap bytes after the first relist.
func (o Options) gcPercent(liveHeap uint64) int {
	switch {
	case o.GCPercent != 0:
		return o.GCPercent
	case o.Mode == generator.ModeGeneric && liveHeap >= genericBigHeap:
		return DefaultGenericGCPercent
	}
	return DefaultGCPercent
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

// endStartup marks the end of the bridge's start-up, its memory peak. It
// sets the garbage collector's target (unless the GOGC environment
// variable chose one): Options.StartupGCPercent until the first relist is
// merged and its events are acked, then Options.GCPercent, and the
// process's own once ctx is done. A negative option leaves the target
// alone in its phase. At the end of the start-up it also tells the
// generator so (Generator.EndStartup): the CRI client then reuses its
// listings, which must not happen earlier for the same reason, and a
// relist fills the client's memo.
//
// Why: the first relist is the bridge's memory peak. It lists the whole
// node (the listing's frames and items, about 10 MB at 1,000 pods and
// 5,000 containers), asks every container's status, and publishes and
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
func (p *pipeline) endStartup(ctx context.Context) {
	tune := os.Getenv("GOGC") == ""
	set := func(percent int) {
		if !tune || percent <= 0 {
			return
		}
		debug.SetGCPercent(percent)
		if h := p.opts.Hooks.OnGCPercent; h != nil {
			h(percent)
		}
	}
	set(p.opts.StartupGCPercent)
	if tune {
		defer debug.SetGCPercent(DefaultGCPercent) // Go's own, GOGC being unset
	}
	if !p.waitStartup(ctx) {
		return
	}
	set(p.opts.gcPercent(liveHeap()))
	// Past the peak, the CRI client may keep what makes a steady relist
	// cheap, GOGC set or not, and a relist at once fills its memo (see
	// Generator.EndStartup): the one full decode of the node after the
	// first relist is then part of the start-up too, rather than of the
	// first safety-net relist, 30 s into the idle evented bridge's life
	// (about 30 ms of CPU at 1,000 pods and 5,000 containers, half again
	// that first 30 s of idle; pleg-bench's idle rows).
	p.gen.EndStartup()
	<-ctx.Done()
}

// waitStartup returns true once the first relist is merged and its events
// are acked (or startupGCLimit after the merge), false if ctx is done
// first.
func (p *pipeline) waitStartup(ctx context.Context) bool {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var s startup
	for {
		select {
		case <-ctx.Done():
			return false
		case now := <-t.C:
			recorded, settled := p.pub.Progress()
			if s.over(now, p.gen.Synced(), recorded, settled) {
				return true
			}
		}
	}
}

// startup tells, from what the bridge reports now and then, when its
// start-up is over: once the events recorded by the time the first relist
// was merged have settled (as many events, that is: see Progress), or
// startupGCLimit after that merge.
//
// Why not once nothing is pending: on a node whose pods churn from the
// start, something is pending at almost every look. The start-up's
// collector target then held for its whole 30 s limit, and under 10,000
// transitions a second the collector's assists took 44 % of the bridge's
// CPU, twice its cost per transition, in 4 of 7 of pleg-bench's
// throughput repetitions (CPU profiles).
type startup struct {
	syncedAt time.Time
	target   uint64 // events recorded when the first relist was merged
}

// over takes what the bridge reports at now: whether the first relist is
// merged, and the publisher's Progress.
func (s *startup) over(now time.Time, synced bool, recorded, settled uint64) bool {
	if !synced {
		return false
	}
	if s.syncedAt.IsZero() {
		s.syncedAt, s.target = now, recorded
	}
	return settled >= s.target || now.Sub(s.syncedAt) > startupGCLimit
}
