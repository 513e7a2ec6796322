package cri

import "sync"

// The CRI connection's receive buffers (experimental.WithBufferPool): each
// HTTP/2 data frame the runtime sends is read into one, at most 16 KB
// (the frame size gRPC's client advertises), and handed back once the
// message it belongs to is decoded.
const (
	frameBufSize = 16 << 10
	// framePoolMax bounds the buffers framePool keeps until grow: 512 KB.
	framePoolMax = 32
	// framePoolListingMax bounds them after grow: 8 MiB, the frames of a
	// listing of some 7,500 kubelet containers.
	framePoolListingMax = 512
)

// framePool reuses a bounded number of frame buffers. gRPC's own pool (a
// sync.Pool per size) kept every frame of a listing reachable through the
// next garbage collection while the relist grouped and merged what it
// decoded: at 5,000 pods and 20,000 containers, 19 MB more live heap at
// the relist's peak. No pool at all allocated a buffer for each frame of
// the event stream, which under churn carries one or more messages a
// transition: 12 % of the bridge's heap allocation (pleg-bench at 2,600
// transitions/s, heap profile). framePool keeps at most framePoolMax
// buffers until it is grown (Client.ReuseListings, once the bridge's
// first relist's events are acked): a listing's frames beyond them are
// garbage once decoded, as without a pool, so that they are not kept
// through the bridge's memory peak (the first relist, its status calls and
// its events), and the stream's, a few at a time, are reused.
//
// Grown, it keeps up to framePoolListingMax, so that each
// later relist reads its listings into the buffers of the one before. A
// steady relist of 1,000 pods and 5,000 containers allocated some 7 MB of
// frames, most of what it allocated once its items came from the memo
// (listMemo): garbage that made the collector mark the whole cache every
// few relists. Keeping them took a quarter of the idle bridge's CPU at
// that size without raising its peak RSS; generic mode's at 5,000/20,000
// rose by some 10 MiB with the memo (pleg-bench; see BENCHMARKS.md).
//
// It is safe for concurrent use: the transport's reader gets buffers, the
// decoding goroutines put them back, and the CRI client grows it.
type framePool struct {
	mu    sync.Mutex
	free  []*[]byte // each of capacity frameBufSize
	grown bool
}

// grow raises the bound to framePoolListingMax.
func (p *framePool) grow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.grown = true
}

// Get returns a buffer of length n, of capacity frameBufSize if n fits.
func (p *framePool) Get(n int) *[]byte {
	if n > frameBufSize {
		b := make([]byte, n)
		return &b
	}
	p.mu.Lock()
	if k := len(p.free); k > 0 {
		b := p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
		p.mu.Unlock()
		*b = (*b)[:n]
		return b
	}
	p.mu.Unlock()
	b := make([]byte, n, frameBufSize)
	return &b
}

// Put keeps b for a later Get if it is one of Get's and the pool has room.
func (p *framePool) Put(b *[]byte) {
	if cap(*b) != frameBufSize {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	limit := framePoolMax
	if p.grown {
		limit = framePoolListingMax
	}
	if len(p.free) < limit {
		p.free = append(p.free, b)
	}
}
