package consumer

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// Defaults of RepeatOptions.
const (
	// DefaultRepeatWindow is how long an event's id is remembered after it
	// was delivered: twice the bridge's default repair window
	// (PLEG_REPAIR_WINDOW, 5 minutes), so that a repair which starts at
	// the end of that window, after a reconnect, still falls inside it.
	DefaultRepeatWindow = 10 * time.Minute
	// DefaultRepeatIDs bounds how many ids are remembered: 1,048,576, at
	// 77 bytes each (81 MB at most; BenchmarkRecentIDsFull). That holds
	// the default window at 1,700 events/s (3.4 times a busy fleet of
	// 1,000 nodes, 500 events/s) and the bridge's 5-minute repair window
	// at 3,500 events/s (a busy fleet of 5,000 nodes makes 2,500). A
	// reader of one node or one namespace stays far below it.
	DefaultRepeatIDs = 1 << 20
)

// RepeatOptions say how Subscribe, Replay and Consume recognise a repeat: an
// event delivered before that the stream holds again, with the same
// CloudEvent id, at a later sequence. That happens when the NATS servers
// lost events they had acknowledged (a power loss, an OS crash: they write
// to disk lazily) and the bridges published them again; a reader that had
// read an event before it was lost sees it twice. A repeat is not handed to
// the application (in a durable group it is acknowledged) and is reported
// to OnRepeat.
//
// The ids of delivered events are kept for Window of the stream's storage
// time, at most MaxIDs of them (the oldest go first), in memory: 77 bytes
// an id, which a reader keeps at the size of its busiest window (Go's maps
// do not shrink), so 23 MB for the default window at 500 events/s. A
// repeat of an event older than that is delivered again, as it would be
// without the check. Checking costs a SHA-256 of the id and a map lookup,
// under a microsecond an event (BenchmarkRecentIDsCheck). The zero value
// uses the defaults.
type RepeatOptions struct {
	// Off turns the check off: every message the stream holds is
	// delivered, repeats included (to audit the stream itself, say).
	Off bool
	// Window is how long an id is kept, measured in the stream's storage
	// times (so that Replay judges history as Subscribe judged it live):
	// DefaultRepeatWindow if zero. It should be at least the bridges'
	// PLEG_REPAIR_WINDOW.
	Window time.Duration
	// MaxIDs bounds the ids kept, DefaultRepeatIDs if zero.
	MaxIDs int
	// OnRepeat, if set, is called with each repeat dropped: to count it,
	// or log it. Subscribe and Replay call it from the goroutine that
	// called them; Consume from its partition goroutines, so there it must
	// be safe for concurrent use.
	OnRepeat func(Repeat)
}

// Repeat is an event dropped because it was delivered before.
type Repeat struct {
	// Event is the repeat, with its own (later) Sequence.
	Event Event
	// FirstSequence is the stream sequence at which the event was
	// delivered first.
	FirstSequence uint64
}

// drop reports whether e, stored at time stored, is a repeat, and reports
// it to OnRepeat if so; else it records e as delivered. Subscribe and
// Replay call it before they hand e on.
func (o RepeatOptions) drop(r *recentIDs, e Event, stored time.Time) bool {
	first, ok := r.check(e.ID, e.Sequence, stored, true)
	if ok && o.OnRepeat != nil {
		o.OnRepeat(Repeat{Event: e, FirstSequence: first})
	}
	return ok
}

// repeat reports whether e, stored at time stored, is a repeat, and
// reports it to OnRepeat if so. redelivery says the message was delivered
// before (a durable group's retry): then the same sequence again is not a
// repeat.
func (o RepeatOptions) repeat(r *recentIDs, e Event, stored time.Time, redelivery bool) bool {
	first, ok := r.check(e.ID, e.Sequence, stored, false)
	ok = ok && (first != e.Sequence || !redelivery)
	if ok && o.OnRepeat != nil {
		o.OnRepeat(Repeat{Event: e, FirstSequence: first})
	}
	return ok
}

// workStreamWindow is the duplicate window of a durable group's work
// stream: the repeat window, or none (the server's default for a stream
// with a source) with Off.
func (o RepeatOptions) workStreamWindow() time.Duration {
	if o.Off {
		return 0
	}
	return cmp.Or(o.Window, DefaultRepeatWindow)
}

// validate reports what is wrong with the options, naming them.
func (o RepeatOptions) validate() error {
	if o.Window < 0 {
		return fmt.Errorf("option Repeats.Window %s is negative", o.Window)
	}
	if o.MaxIDs < 0 {
		return fmt.Errorf("option Repeats.MaxIDs %d is negative", o.MaxIDs)
	}
	return nil
}

// newRecent returns the set the options ask for, nil if Off.
func (o RepeatOptions) newRecent() *recentIDs {
	if o.Off {
		return nil
	}
	return &recentIDs{
		window: cmp.Or(o.Window, DefaultRepeatWindow),
		max:    cmp.Or(o.MaxIDs, DefaultRepeatIDs),
		first:  make(map[idKey]uint64),
	}
}

// idKey is an id's SHA-256, cut to 128 bits: a fixed size whatever the
// publisher's ids, and no pointer for the garbage collector to follow in
// a map of a million. Two ids of one window sharing a key (and a later
// event wrongly dropped) has a chance of about n²/2¹²⁹, 10⁻²⁷ at a
// million.
type idKey [16]byte

func keyOf(id string) idKey {
	sum := sha256.Sum256([]byte(id))
	return idKey(sum[:16])
}

// recentID is one id of recentIDs' queue, with the storage time of its
// event.
type recentID struct {
	key    idKey
	stored int64 // Unix nanoseconds
}

// recentIDs is a bounded set of the ids of recently delivered events, each
// with the stream sequence it was delivered at. Ids leave it oldest first
// (in the order they were added), when their event's storage time is more
// than window before that of the event being checked, or when it holds max.
// Judging by storage times rather than the clock makes the window mean the
// same for a live reader and a replay of history, and needs no timer.
//
// A nil *recentIDs checks nothing. It is safe for concurrent use: a
// durable group's partitions share one.
type recentIDs struct {
	window time.Duration
	max    int

	mu    sync.Mutex
	first map[idKey]uint64 // guarded by mu; the sequence each id was delivered at
	// queue holds first's ids in the order they were added, as a ring of
	// n entries from head; it grows by doubling up to max. Guarded by mu.
	queue   []recentID
	head, n int
}

// check reports whether the event id, stored at seq at time stored, was
// delivered before, and at which sequence. It first lets go of the ids too
// old for stored; with record, it then records the event as delivered
// unless it is a repeat (add).
//
// The same sequence again is a repeat too: Subscribe and Replay, whose
// ordered consumers never deliver a sequence twice, read a sequence again
// only after a rollback, and what they find there with an id they
// delivered is that event stored again. A durable group tells a retry
// from that itself (repeat).
func (r *recentIDs) check(id string, seq uint64, stored time.Time, record bool) (first uint64, repeat bool) {
	if r == nil || id == "" {
		return 0, false
	}
	k := keyOf(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(stored.UnixNano() - int64(r.window))
	first, ok := r.first[k]
	if !ok && record {
		r.put(k, seq, stored)
	}
	return first, ok
}

// add records that the event id, stored at seq at time stored, was
// delivered. An id known already keeps its first sequence.
func (r *recentIDs) add(id string, seq uint64, stored time.Time) {
	if r == nil || id == "" {
		return
	}
	k := keyOf(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.first[k]; !ok {
		r.put(k, seq, stored)
	}
}

// put adds k, which it does not hold, making room first. mu must be held.
func (r *recentIDs) put(k idKey, seq uint64, stored time.Time) {
	if r.n == r.max {
		r.pop()
	}
	if r.n == len(r.queue) {
		r.grow()
	}
	r.queue[(r.head+r.n)%len(r.queue)] = recentID{key: k, stored: stored.UnixNano()}
	r.n++
	r.first[k] = seq
}

// expire lets go of the oldest ids while they were stored before since.
// mu must be held.
func (r *recentIDs) expire(since int64) {
	for r.n > 0 && r.queue[r.head].stored < since {
		r.pop()
	}
}

// pop lets go of the oldest id. mu must be held.
func (r *recentIDs) pop() {
	delete(r.first, r.queue[r.head].key)
	r.head = (r.head + 1) % len(r.queue)
	r.n--
}

// grow doubles the queue, up to max, keeping its order. mu must be held.
func (r *recentIDs) grow() {
	size := min(max(2*len(r.queue), 64), r.max)
	q := make([]recentID, size)
	for i := range r.n {
		q[i] = r.queue[(r.head+i)%len(r.queue)]
	}
	r.queue, r.head = q, 0
}

// size returns how many ids it holds.
func (r *recentIDs) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}
