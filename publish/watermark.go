package publish

import "time"

// watermark computes the sequence OnAck reports, which the checkpoint
// writes with the acks and the next run reads back from (readback.go says
// why the highest ack's own sequence would not do). Only Run's goroutine
// touches it.
type watermark struct {
	// high is the highest sequence this run knows this node stored at:
	// acks, checks, the read's end.
	high uint64
	// marks holds, in send order, a mark for the messages that may be
	// stored and are not delivered, each with high at their first send;
	// floors never decrease along it. Marks emptied at its front are
	// dropped, those behind a live one wait for it.
	marks []*sendMark
	// holding is set while the read's messages hold the watermark at
	// holdAt (Restart.From−1), until holdUntil or all are recognised.
	holding   bool
	holdAt    uint64
	holdUntil time.Time
}

// sendMark counts the messages first sent while high was floor, and not
// delivered yet.
type sendMark struct {
	floor uint64
	n     int
}

// stored takes in that this node's message is stored at seq.
func (w *watermark) stored(seq uint64) { w.high = max(w.high, seq) }

// sent returns the mark of a message sent now for the first time (or the
// first time since a failure that proved it was not stored).
func (w *watermark) sent() *sendMark {
	if n := len(w.marks); n > 0 && w.marks[n-1].floor == w.high {
		w.marks[n-1].n++
		return w.marks[n-1]
	}
	m := &sendMark{floor: w.high, n: 1}
	w.marks = append(w.marks, m)
	return m
}

// settled releases the mark of a message that is delivered, or proved not
// stored.
func (w *watermark) settled(m *sendMark) {
	m.n--
	for len(w.marks) > 0 && w.marks[0].n == 0 {
		w.marks[0] = nil
		w.marks = w.marks[1:]
	}
}

// rewind lowers the watermark to seq, at most: the stream went backwards
// to seq, and gives the sequences above it again.
func (w *watermark) rewind(seq uint64) {
	w.high = min(w.high, seq)
	for _, m := range w.marks {
		m.floor = min(m.floor, seq)
	}
	w.holdAt = min(w.holdAt, seq)
}

// value returns the watermark: every message this node stored at or below
// it was acked and reported to OnAck (or is held, above).
func (w *watermark) value() uint64 {
	v := w.high
	if len(w.marks) > 0 {
		v = w.marks[0].floor
	}
	if w.holding {
		v = min(v, w.holdAt)
	}
	return v
}
