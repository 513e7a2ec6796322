package bridge

import (
	"context"
	"time"
)

// startupLimit bounds how long the start-up lasts once the first relist
// is merged, when its events cannot all be delivered (NATS down at the
// start).
const startupLimit = 30 * time.Second

// endStartup marks the end of the bridge's start-up, its memory peak: once
// the first relist is merged and its events are acked (or startupLimit
// after the merge). It then tells the generator (Generator.EndStartup: the
// CRI client may reuse its listings from now on, which must not happen
// earlier, and a relist fills the client's memo) and calls
// Options.StartupOver, where the process's owner moves the garbage
// collector's target off its start-up value (internal/gctune). The bridge
// itself never sets a process-wide target: a benchmark or test running
// bridges in its own process keeps its collector.
//
// Why at once: the one full decode of the node after the first relist is
// then part of the start-up too, rather than of the first safety-net
// relist, 30 s into the idle evented bridge's life (about 30 ms of CPU at
// 1,000 pods and 5,000 containers, half again that first 30 s of idle;
// pleg-bench's idle rows).
func (p *pipeline) endStartup(ctx context.Context) {
	if !p.waitStartup(ctx) {
		return
	}
	if f := p.opts.StartupOver; f != nil {
		f()
	}
	p.gen.EndStartup()
}

// waitStartup returns true once the first relist is merged and its events
// are acked (or startupLimit after the merge), false if ctx is done
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
// startupLimit after that merge.
//
// Why not once nothing is pending: on a node whose pods churn from the
// start, something is pending at almost every look. The start-up's
// collector target (internal/gctune) then held for its whole 30 s limit, and under 10,000
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
	return settled >= s.target || now.Sub(s.syncedAt) > startupLimit
}
