package cri

import "testing"

func TestFramePoolReusesABoundedNumberOfBuffers(t *testing.T) {
	var p framePool
	b := p.Get(1200)
	if len(*b) != 1200 || cap(*b) != frameBufSize {
		t.Fatalf("Get(1200): len %d cap %d", len(*b), cap(*b))
	}
	(*b)[0] = 1
	p.Put(b)
	if again := p.Get(frameBufSize); again != b || len(*again) != frameBufSize {
		t.Fatalf("Get after Put: %p len %d, want the buffer put back (%p) at full length", again, len(*again), b)
	}

	// A listing's frames: all of them out at once, then all back.
	out := make([]*[]byte, 10*framePoolMax)
	for i := range out {
		out[i] = p.Get(frameBufSize)
	}
	for _, b := range out {
		p.Put(b)
	}
	if n := len(p.free); n != framePoolMax {
		t.Fatalf("kept %d buffers, want the bound %d", n, framePoolMax)
	}

	// Larger than a frame: allocated as asked, and not kept.
	big := p.Get(frameBufSize + 1)
	if len(*big) != frameBufSize+1 {
		t.Fatalf("Get(%d): len %d", frameBufSize+1, len(*big))
	}
	p.Put(big)
	p.Put(&[]byte{})
	if n := len(p.free); n != framePoolMax {
		t.Fatalf("kept %d buffers after foreign Puts, want %d", n, framePoolMax)
	}
}

// TestFramePoolKeepsAListingOnceGrown: after grow, a listing's frames are
// kept, up to framePoolListingMax, and the next listing allocates none.
func TestFramePoolKeepsAListingOnceGrown(t *testing.T) {
	var p framePool
	listing := func(frames int) {
		out := make([]*[]byte, frames)
		for i := range out {
			out[i] = p.Get(frameBufSize)
		}
		for _, b := range out {
			p.Put(b)
		}
	}
	listing(300)
	if n := len(p.free); n != framePoolMax {
		t.Fatalf("kept %d buffers before grow, want %d", n, framePoolMax)
	}
	p.grow()
	listing(300)
	if n := len(p.free); n != 300 {
		t.Fatalf("kept %d buffers of a 300-frame listing after grow, want 300", n)
	}
	if n := testing.AllocsPerRun(5, func() { listing(300) }); n > 1 {
		t.Fatalf("%v allocations per 300-frame listing once grown, want at most the slice of frames", n)
	}
	listing(2 * framePoolListingMax)
	if n := len(p.free); n != framePoolListingMax {
		t.Fatalf("kept %d buffers, want the bound %d", n, framePoolListingMax)
	}
}

func TestFramePoolAllocatesNothingInSteadyUse(t *testing.T) {
	var p framePool
	p.Put(p.Get(100))
	if n := testing.AllocsPerRun(100, func() { p.Put(p.Get(1500)) }); n != 0 {
		t.Fatalf("%v allocations per Get and Put, want 0", n)
	}
}
