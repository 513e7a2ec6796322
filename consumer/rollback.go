package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultRollbackCheck is how often Subscribe looks, while no message
// arrives, whether the stream still holds what it read last (Options.RollbackCheck).
const DefaultRollbackCheck = 30 * time.Second

const (
	// rollbackRing is how many of the messages read last Subscribe
	// remembers, to find where a rolled-back stream diverged without
	// asking the server's clock: a rollback that rewrote fewer of the
	// reader's messages than this is found by sequence, a larger one by
	// storage time (Rollback). 32 bytes an entry.
	rollbackRing = 64
	// rollbackCheckTimeout bounds each request of a check. A server
	// still recovering its streams, or one that refuses the reader a get
	// by sequence without answering, costs this once.
	rollbackCheckTimeout = time.Second
	// rollbackRetry is how soon a check that could not be made, or a
	// restart that failed, is tried again: the servers are coming back.
	rollbackRetry = time.Second
)

// Rollback reports that the stream no longer holds what Subscribe read
// last: its servers lost messages they had acknowledged (a power loss,
// an OS crash; they write to disk lazily) and came back with an older
// store, so the stream stored new messages, other nodes' events and the
// bridges' republished ones, at sequences that Subscribe had read
// already. Subscribe then reads again from where the stream diverged;
// what it had delivered before comes back with the same ids and is
// dropped as a repeat (RepeatOptions), the rest is delivered.
type Rollback struct {
	// LastRead is the stream sequence of the last message read before
	// the rollback was noticed.
	LastRead uint64
	// StreamLast is the stream's last sequence when the rollback was
	// noticed, if it was asked for (0 if not); below LastRead unless the
	// stream had stored more since.
	StreamLast uint64
	// From is the sequence Subscribe reads again from: one after the
	// last message read that the stream still holds as it was read. It
	// is 0 when none of the last messages read is still there, or the
	// reader may not get messages by sequence; then Subscribe reads again
	// every message stored after After, the storage time of the last
	// message read (which assumes that the server's clock did not go
	// back across the restart).
	From  uint64
	After time.Time
}

// readPos is where one message was read: its stream sequence, its
// Nats-Msg-Id and its storage time.
type readPos struct {
	seq    uint64
	id     idKey
	stored time.Time
}

// readRing holds the positions of the last rollbackRing messages read, in
// stream order. It is used from one goroutine.
type readRing struct {
	pos     [rollbackRing]readPos
	head, n int
}

func (r *readRing) add(p readPos) {
	if r.n == len(r.pos) {
		r.head = (r.head + 1) % len(r.pos)
		r.n--
	}
	r.pos[(r.head+r.n)%len(r.pos)] = p
	r.n++
}

// at returns the i-th newest position (0 the newest).
func (r *readRing) at(i int) readPos { return r.pos[(r.head+r.n-1-i)%len(r.pos)] }

// keep keeps the positions before seq.
func (r *readRing) keep(seq uint64) {
	for r.n > 0 && r.at(0).seq >= seq {
		r.n--
	}
}

// restartPoint is where reading starts again after a rollback: at seq, or
// (seq 0) at the first message stored after after.
type restartPoint struct {
	seq   uint64
	after time.Time
}

// rollbackCheck finds out whether the stream still holds the messages
// Subscribe read last, and where to read again from if not. It is used
// from Subscribe's goroutine.
type rollbackCheck struct {
	lookup streamLookup
	ring   readRing
	// noGets is set once the server answered the stream's info but not a
	// get of a message: the reader may not make that request (a reader
	// limited to namespaces). Checks then compare the stream's last
	// sequence only.
	noGets bool
}

// read records that the message at p was read.
func (c *rollbackCheck) read(p readPos) { c.ring.add(p) }

// check returns where to read again from if the stream diverged from what
// was read, nil if it did not (or nothing was read yet), and the stream's
// last sequence if it asked for it. An error means it could not tell.
func (c *rollbackCheck) check(ctx context.Context) (*restartPoint, uint64, error) {
	if c.ring.n == 0 {
		return nil, 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, rollbackCheckTimeout)
	defer cancel()
	stream, err := c.lookup(ctx)
	if err != nil {
		return nil, 0, err
	}
	last := c.ring.at(0)
	if !c.noGets {
		held, err := c.holds(ctx, stream, last)
		switch {
		case err == nil && held:
			return nil, 0, nil
		case err == nil:
			return c.divergence(ctx, stream, last)
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			// No answer to the get: if the stream's info is answered, the
			// get is refused; else the servers are not back yet.
			info, ierr := stream.Info(ctx)
			if ierr != nil {
				return nil, 0, fmt.Errorf("get message %d: %w", last.seq, err)
			}
			c.noGets = true
			if info.State.LastSeq < last.seq {
				return &restartPoint{after: last.stored}, info.State.LastSeq, nil
			}
			return nil, info.State.LastSeq, nil
		}
		// Not found: removed by the stream's limits, or rolled back.
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("stream info: %w", err)
	}
	if info.State.LastSeq >= last.seq {
		return nil, info.State.LastSeq, nil
	}
	if c.noGets {
		return &restartPoint{after: last.stored}, info.State.LastSeq, nil
	}
	p, _, err := c.divergence(ctx, stream, last)
	return p, info.State.LastSeq, err
}

// divergence walks back through the ring, from the message before last,
// to the newest message the stream still holds as it was read, and returns
// the sequence after it; or, if none is held, the first message stored
// after last.
func (c *rollbackCheck) divergence(ctx context.Context, stream jetstream.Stream, last readPos) (*restartPoint, uint64, error) {
	for i := 1; i < c.ring.n; i++ {
		p := c.ring.at(i)
		held, err := c.holds(ctx, stream, p)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, 0, fmt.Errorf("get message %d: %w", p.seq, err)
		}
		if held {
			return &restartPoint{seq: p.seq + 1}, 0, nil
		}
	}
	return &restartPoint{after: last.stored}, 0, nil
}

// holds reports whether the stream holds at p's sequence the message that
// was read there: the same Nats-Msg-Id, stored at the same time (a
// message stored again at the same sequence, even the same event, has a
// later storage time).
func (c *rollbackCheck) holds(ctx context.Context, stream jetstream.Stream, p readPos) (bool, error) {
	msg, err := stream.GetMsg(ctx, p.seq)
	if err != nil {
		return false, err
	}
	return keyOf(msg.Header.Get(jetstream.MsgIDHeader)) == p.id && msg.Time.Equal(p.stored), nil
}

// waker ends a wait for the next message early when the connection has
// reconnected, so that a check is made at once: a rollback needs the
// servers to restart, and a reader connected to them reconnects.
type waker struct {
	mu     sync.Mutex
	cancel context.CancelFunc // guarded by mu: ends the current wait
	due    bool               // guarded by mu: a reconnect since the last take
}

// watch rings w on each status received from reconnected until ctx is
// done or reconnected is closed. It blocks.
func (w *waker) watch(ctx context.Context, reconnected chan nats.Status) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-reconnected:
			if !ok {
				return
			}
			w.mu.Lock()
			w.due = true
			if w.cancel != nil {
				w.cancel()
			}
			w.mu.Unlock()
		}
	}
}

// wait returns the context of one wait for a message: ctx until deadline,
// ended early by a reconnect. done must be called when the wait is over.
func (w *waker) wait(ctx context.Context, deadline time.Time) (wctx context.Context, done func()) {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	w.mu.Lock()
	w.cancel = cancel
	if w.due {
		cancel()
	}
	w.mu.Unlock()
	return wctx, func() {
		w.mu.Lock()
		w.cancel = nil
		w.mu.Unlock()
		cancel()
	}
}

// take reports whether the connection reconnected since the last take.
func (w *waker) take() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	due := w.due
	w.due = false
	return due
}
