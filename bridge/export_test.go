package bridge

// SteadyGCPercent exposes the steady garbage collection target of opts for
// a live heap of liveHeap bytes.
func SteadyGCPercent(opts Options, liveHeap uint64) int { return opts.gcPercent(liveHeap) }
