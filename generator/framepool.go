package generator

import "sync"

// The CRI connection's receive buffers (experimental.WithBufferPool): each
// HTTP/2 data frame the runtime sends is read into one, at most 16 KB
// (the frame size gRPC's client advertises), and handed back once the
// message it belongs to is decoded.
const (
	frameBufSize = 16 << 10
	// framePoolMax bounds the buffers framePool keeps: 512 KB.
	framePoolMax = 32
)

// framePool reuses a bounded number of frame buffers. gRPC's own pool (a
// sync.Pool per size) kept every frame of a listing reachable through the
// next garbage collection while the relist grouped and merged what it
// decoded: at 5,000 pods and 20,000 containers, 19 MB more live heap at
// the relist's peak. No pool at all allocated a buffer for each frame of
// the event stream, which under churn carries one or more messages a
// transition: 12 % of the bridge's heap allocation (pleg-bench at 2,600
// transitions/s, heap profile). framePool keeps at most framePoolMax
// buffers: a listing's frames beyond them are garbage once decoded, as
// without a pool, and the stream's, a few at a time, are reused.
//
// It is safe for concurrent use: the transport's reader gets buffers, the
// decoding goroutines put them back.
type framePool struct {
	mu   sync.Mutex
	free []*[]byte // each of capacity frameBufSize
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
	if len(p.free) < framePoolMax {
		p.free = append(p.free, b)
	}
}
