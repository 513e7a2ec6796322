package bridge

import (
	"context"
	"os"
	"runtime/debug"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Defaults of Options.StartupGCPercent and Options.GCPercent.
const (
	DefaultStartupGCPercent = 25
	// DefaultGCPercent is the steady target in the modes that follow
	// events: Go's own default.
	DefaultGCPercent = 100
	// DefaultGenericGCPercent is the steady target in generic mode, which
	// lists the whole node every second.
	DefaultGenericGCPercent = 50
)

// startupGCLimit bounds how long the start-up target holds once the first
// relist is merged, when its events cannot all be delivered (NATS down at
// the start).
const startupGCLimit = 30 * time.Second

// gcPercent returns the steady garbage collection target of o (defaults
// applied).
func (o Options) gcPercent() int {
	switch {
	case o.GCPercent != 0:
		return o.GCPercent
	case o.Mode == generator.ModeGeneric:
		return DefaultGenericGCPercent
	}
	return DefaultGCPercent
}

// tuneGC sets the garbage collector's target (unless the GOGC environment
// variable chose one): Options.StartupGCPercent until the first relist is
// merged and its events are acked, then Options.GCPercent, and the
// process's own once ctx is done. A negative option leaves the target
// alone in its phase.
//
// Why: the first relist is the bridge's memory peak. It lists the whole
// node (the listing's frames and items, about 10 MB at 1,000 pods and
// 5,000 containers), asks every container's status, and publishes and
// writes through an event for each, most of it garbage soon after. With
// GOGC=100 the heap grows to twice what is live at that moment: the peak
// RSS was 64-77 MiB at 1,000/5,000 against a 64 MiB target, 58-59 MiB
// with 25 for the start-up alone. Generic mode lists the whole node every
// second, and at 100 its steady relists alone reached 65-66 MiB; at 50,
// 59 MiB, for 0.58x the bare relist loop's CPU instead of 0.48x
// (pleg-bench, BENCHMARKS.md). The modes that follow events keep 100:
// under churn a lower target costs CPU on every transition.
func (p *pipeline) tuneGC(ctx context.Context) {
	if os.Getenv("GOGC") != "" {
		return
	}
	set := func(percent int) {
		if percent <= 0 {
			return
		}
		debug.SetGCPercent(percent)
		if h := p.opts.Hooks.OnGCPercent; h != nil {
			h(percent)
		}
	}
	set(p.opts.StartupGCPercent)
	defer debug.SetGCPercent(DefaultGCPercent) // Go's own, GOGC being unset
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var synced time.Time
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !p.gen.Synced() {
				continue
			}
			if synced.IsZero() {
				synced = now
			}
			done = p.pub.Pending() == 0 || now.Sub(synced) > startupGCLimit
		}
	}
	t.Stop()
	set(p.opts.gcPercent())
	<-ctx.Done()
}
