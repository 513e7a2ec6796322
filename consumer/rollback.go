package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultRollbackCheck is how often Subscribe and each member of a durable
// group check that the stream still holds what they read last
// (Options.RollbackCheck, DurableOptions.RollbackCheck).
const DefaultRollbackCheck = 30 * time.Second

const (
	// rollbackRing is how many of the messages read last Subscribe
	// remembers, to find where a rolled-back stream diverged without
	// asking the server's clock: a rollback that rewrote fewer of the
	// reader's messages than this is found by sequence, a larger one by
	// storage time (Rollback). 48 bytes an entry, and its id.
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
	id     string
	stored time.Time
}

// readRing holds the positions of the last rollbackRing messages read,
// in the order they were recorded.
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

// sorted returns the positions by sequence.
func (r *readRing) sorted() []readPos {
	ps := make([]readPos, r.n)
	for i := range ps {
		ps[i] = r.pos[(r.head+i)%len(r.pos)]
	}
	slices.SortFunc(ps, func(a, b readPos) int { return cmp.Compare(a.seq, b.seq) })
	return ps
}

// keep keeps the positions before seq, none if seq is 0.
func (r *readRing) keep(seq uint64) {
	ps := r.sorted()
	r.head, r.n = 0, 0
	for _, p := range ps {
		if p.seq < seq {
			r.add(p)
		}
	}
}

// restartPoint is where reading starts again after a rollback: at seq, or
// (seq 0) at the first message stored after after.
type restartPoint struct {
	seq   uint64
	after time.Time
}

// rollbackCheck finds out whether the stream still holds the messages
// read last, and where to read again from if not. Positions are recorded
// from any goroutine (a durable group's partitions); check and forget are
// called from one.
type rollbackCheck struct {
	lookup streamLookup
	// idOnly compares the Nats-Msg-Id only: a durable group knows the
	// storage times of the work stream's copies, not of the stream's
	// messages.
	idOnly bool

	mu   sync.Mutex
	ring readRing // guarded by mu

	// noGets is set once the server answered the stream's info but not a
	// get of a message: the reader may not make that request (a reader
	// limited to namespaces). Checks then compare the stream's last
	// sequence only.
	noGets bool
}

// read records that the message at p was read.
func (c *rollbackCheck) read(p readPos) {
	c.mu.Lock()
	c.ring.add(p)
	c.mu.Unlock()
}

// forget forgets the positions at and after seq, all if seq is 0 (a
// restart by storage time): the stream no longer holds them as read.
func (c *rollbackCheck) forget(seq uint64) {
	c.mu.Lock()
	c.ring.keep(seq)
	c.mu.Unlock()
}

// check returns where to read again from if the stream diverged from what
// was read, nil if it did not (or nothing was read yet), with the last
// position read and the stream's last sequence if it asked for it. An
// error means it could not tell.
func (c *rollbackCheck) check(ctx context.Context) (p *restartPoint, last readPos, streamLast uint64, err error) {
	c.mu.Lock()
	ps := c.ring.sorted()
	c.mu.Unlock()
	if len(ps) == 0 {
		return nil, readPos{}, 0, nil
	}
	last = ps[len(ps)-1]
	ctx, cancel := context.WithTimeout(ctx, rollbackCheckTimeout)
	defer cancel()
	stream, err := c.lookup(ctx)
	if err != nil {
		return nil, last, 0, err
	}
	if !c.noGets {
		held, err := c.holds(ctx, stream, last)
		switch {
		case err == nil && held:
			return nil, last, 0, nil
		case err == nil:
			p, err := c.divergence(ctx, stream, ps)
			return p, last, 0, err
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			// No answer to the get: if the stream's info is answered, the
			// get is refused; else the servers are not back yet.
			info, ierr := stream.Info(ctx)
			if ierr != nil {
				return nil, last, 0, fmt.Errorf("get message %d: %w", last.seq, err)
			}
			c.noGets = true
			if info.State.LastSeq < last.seq {
				return &restartPoint{after: last.stored}, last, info.State.LastSeq, nil
			}
			return nil, last, info.State.LastSeq, nil
		}
		// Not found: removed by the stream's limits, or rolled back.
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, last, 0, fmt.Errorf("stream info: %w", err)
	}
	if info.State.LastSeq >= last.seq {
		return nil, last, info.State.LastSeq, nil
	}
	if c.noGets {
		return &restartPoint{after: last.stored}, last, info.State.LastSeq, nil
	}
	p, err = c.divergence(ctx, stream, ps)
	return p, last, info.State.LastSeq, err
}

// divergence finds, in ps sorted by sequence, the first message the
// stream no longer holds as it was read, and returns the sequence after the
// one before it; or, if that is the first, the first message stored after
// the last one read. It walks from the oldest: a message stored again at
// its own sequence after the rollback (a bridge's repeat of the event
// read there, with the same id) is not taken for the point where the
// stream diverged.
func (c *rollbackCheck) divergence(ctx context.Context, stream jetstream.Stream, ps []readPos) (*restartPoint, error) {
	held := 0 // how many of the oldest the stream holds as read
	for _, p := range ps[:len(ps)-1] {
		ok, err := c.holds(ctx, stream, p)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, fmt.Errorf("get message %d: %w", p.seq, err)
		}
		if !ok {
			break
		}
		held++
	}
	if held == 0 {
		return &restartPoint{after: ps[len(ps)-1].stored}, nil
	}
	return &restartPoint{seq: ps[held-1].seq + 1}, nil
}

// holds reports whether the stream holds at p's sequence the message that
// was read there: the same Nats-Msg-Id, stored at the same time unless
// idOnly (a message stored again at the same sequence, even the same
// event, has a later storage time).
func (c *rollbackCheck) holds(ctx context.Context, stream jetstream.Stream, p readPos) (bool, error) {
	msg, err := stream.GetMsg(ctx, p.seq)
	if err != nil {
		return false, err
	}
	return msg.Header.Get(jetstream.MsgIDHeader) == p.id && (c.idOnly || msg.Time.Equal(p.stored)), nil
}

// waker wakes Subscribe's wait for the next message when a check is due:
// every RollbackCheck, and at once after the connection reconnects (a
// rollback needs the servers to restart, and a reader connected to them
// reconnects). Each wait uses the context of the current round, which a
// wake cancels; the next round starts with rearm. So a message read costs
// no timer and no context of its own.
type waker struct {
	mu     sync.Mutex
	round  context.Context    // guarded by mu
	cancel context.CancelFunc // guarded by mu
	timer  *time.Timer        // guarded by mu
}

// rearm starts a round that ends after d, or at the next wake, or when ctx
// is done.
func (w *waker) rearm(ctx context.Context, d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel()
	}
	w.round, w.cancel = context.WithCancel(ctx)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.wake)
	} else {
		w.timer.Reset(d)
	}
}

// wake ends the current round.
func (w *waker) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel()
	}
}

// wait returns the context of a wait in the current round.
func (w *waker) wait() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.round
}

// due reports whether the current round ended: a check is due.
func (w *waker) due() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.round.Err() != nil
}

// stop stops the timer and ends the round.
func (w *waker) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.cancel != nil {
		w.cancel()
	}
}

// watch wakes w on each status received from reconnected until ctx is
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
			w.wake()
		}
	}
}

// watchRollback checks that the event stream still holds the last events
// this member handled, every RollbackCheck and at once after a reconnect,
// and has the work stream copy again from where the stream diverged if
// not (restartSource). It blocks until ctx is done.
func (m *member) watchRollback(ctx context.Context, reconnected chan nats.Status) {
	t := time.NewTimer(m.opts.RollbackCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-reconnected:
			if !ok {
				reconnected = nil
				continue
			}
		case <-t.C:
		}
		next := m.opts.RollbackCheck
		if soon := m.rollback(ctx); soon {
			next = rollbackRetry
		}
		t.Reset(next)
	}
}

// rollback checks the event stream once and restarts the work stream's
// source if it diverged. It reports whether to check again soon: the check
// could not be made (the servers are coming back). A source that could not
// be restarted (a member without the permission to update the work
// stream, say) is tried again at the next regular check.
func (m *member) rollback(ctx context.Context) (soon bool) {
	p, last, streamLast, err := m.origin.check(ctx)
	if err != nil {
		return true
	}
	if p == nil {
		return false
	}
	start := p.seq
	if start == 0 {
		if start, err = firstSince(ctx, m.js, m.opts.stream(), m.opts.subjectPrefix()+".>", p.after.Add(time.Nanosecond)); err != nil {
			return true
		}
	}
	if err := restartSource(ctx, m.js, m.opts.WorkStream(), start); err != nil {
		return false
	}
	m.origin.forget(p.seq)
	if m.opts.OnRollback != nil {
		m.opts.OnRollback(Rollback{LastRead: last.seq, StreamLast: streamLast, From: start, After: p.after})
	}
	return false
}

// restartSource has the work stream copy the event stream again from
// sequence start. The server keeps, for each source, the last sequence it
// copied and skips anything at or before it, also when the source's start
// is changed; but a source with other subject transforms is a new source
// to it, which starts at its OptStartSeq. So the source's two transforms
// swap places: one selects the subjects of four tokens after the prefix,
// the other of three, so their order changes nothing else, and
// checkWorkStream accepts either. What the work stream copied before
// comes again with the same Nats-Msg-Id and is dropped by its duplicate
// window (DurableOptions.Repeats).
//
// A new source also looks for the last sequence it copied in the headers
// of the messages the work stream holds: one swap back to an order used
// before, while the work stream still holds messages copied in that order,
// starts after them, not at start.
func restartSource(ctx context.Context, js jetstream.JetStream, name string, start uint64) error {
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	cfg := stream.CachedInfo().Config
	if len(cfg.Sources) != 1 || cfg.Sources[0] == nil || len(cfg.Sources[0].SubjectTransforms) != 2 {
		return fmt.Errorf("%w: it is not a work queue with one source through two transforms", ErrGroupChanged)
	}
	src := *cfg.Sources[0]
	src.SubjectTransforms = slices.Clone(src.SubjectTransforms)
	slices.Reverse(src.SubjectTransforms)
	src.OptStartSeq, src.OptStartTime = start, nil
	cfg.Sources = []*jetstream.StreamSource{&src}
	_, err = js.UpdateStream(ctx, cfg)
	return err
}
