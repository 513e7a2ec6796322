package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Exactly once past the duplicate window.
//
// JetStream drops a repeated Nats-Msg-Id only within the stream's duplicate
// window. A retry whose earlier attempt may have been stored (an ack that
// timed out, a connection lost with the publish on the wire: nothing that
// proves it was not stored) is therefore safe only while that attempt is
// younger than the window. Past half the window (the other half is margin
// for clocks and queues between our send and the server's store), the
// publisher asks the stream first: the last message on the event's exact
// subject, compared by Nats-Msg-Id. If it is this event, the event is
// delivered and is not published again.
//
// Why the last message on the exact subject suffices: the subject is
// <prefix>.<node>.<podUID>.<eventType>, so only this node's publisher
// writes it, and it keeps at most one message per pod in flight: a later
// message on that subject is published only after this one was acked, which
// it was not. If the stored copy landed after the check (it was still in a
// queue), it is younger than the window when the re-send arrives, and
// JetStream drops the re-send as a duplicate.
//
// That argument holds within one run only. What an earlier run stored and
// its checkpoint does not know of (acks a crash lost, spool entries it
// published) is found by the read at start (readback.go) instead, which
// is exact: the last message on a subject is not, when two containers of a
// pod had events of one type stored after the checkpoint. Only without
// that read (Options.Restart.From 0: a checkpoint of a bridge that did not
// record sequences) is an earlier run's spool entry asked for this way.
//
// An expected-last-subject-sequence condition on every publish would make
// the publication idempotent with no read, but it needs the subject's last
// sequence before each publish (a read per pod after every restart, and
// state per subject) and turns a concurrent writer or a purge into errors
// that stall a pod. The check costs one get per retry that is this old;
// nothing on the normal path.
//
// The get is a direct get if the stream allows them (AllowDirect), else the
// stream leader answers through the JetStream API. A replica answers a
// direct get only once it has caught up with the leader, and anything old
// enough to need the check (half a window, a minute by default) was
// replicated long before, so a follower's answer is as good as the
// leader's here. A window the caller sets longer than the stream's
// (Options.DuplicateWindow) makes retries skip checks they need.
//
// The argument needs a publish to reach the server about when it is
// made. nats.go buffers what is published while it reconnects and sends it
// after the reconnect, however late, so the publisher publishes nothing
// while the connection is down. A publish made in the instant the
// connection drops, after that test, is still buffered: if it is a retry
// of a stored message and the outage outlasts the window, the event is
// stored twice.
//
// Crash windows, after the duplicate window (within it, ids make any
// re-send harmless):
//
//   - Acks not yet written by the checkpoint (100 ms of them), and messages
//     in flight: their messages were stored after the sequence the
//     checkpoint wrote, the read at the restart finds them, and the events
//     the generator reports again are not published.
//   - A spool entry acked but not yet removed: Open drops it if its ack
//     was written (durable), the read finds it if not.
//   - A message of the earlier run still in a server's queue when the read
//     takes the stream's last sequence is stored after it and not read; a
//     re-send comes within the window of that store, and is dropped.
//   - A checkpoint without a sequence (a fresh data directory, a store set
//     aside, one written by a bridge that did not record sequences) gives
//     nothing to read from: what the generator reports again is published
//     again, and stored twice if the earlier copy is older than the window.
//     So does, without a sequence, a spool entry acked and Done with a later
//     event of its pod and type, all within the spool's write interval
//     (100 ms) before a crash: the later event is last on the subject.

// checkWorkers bounds the checks running at once. A check is one request
// and reply; after an outage a few hundred of them may be due at once (one
// per pod in flight, or a spool full of earlier entries), and four in
// parallel clear that in a fraction of a second on a LAN while leaving the
// server's API alone.
const checkWorkers = 4

// checkRequest asks whether the message with id is the last one stored on
// subject. pod is the caller's token for the answer; the workers never
// touch it.
type checkRequest struct {
	pod     *podQueue
	subject string
	id      string
}

// checkResult answers a checkRequest: the sequence the message is stored
// at (0: not stored), or an error when the stream could not be asked.
type checkResult struct {
	pod *podQueue
	seq uint64
	err error
}

// checker runs the checks of one Run on a few worker goroutines. The
// delivery loop sends requests and receives results; both channels have
// room for one request per message in flight, and the loop has at most that
// many outstanding, so neither side blocks.
type checker struct {
	js      jetstream.JetStream
	stream  string        // empty: looked up by subject
	timeout time.Duration // of one check
	reqs    chan checkRequest
	results chan checkResult
	wg      sync.WaitGroup
}

func newChecker(js jetstream.JetStream, stream string, maxInFlight int, timeout time.Duration) *checker {
	return &checker{
		js:      js,
		stream:  stream,
		timeout: timeout,
		reqs:    make(chan checkRequest, maxInFlight),
		results: make(chan checkResult, maxInFlight),
	}
}

// start starts the workers; they run until ctx is done. The caller waits
// for them with wait.
func (c *checker) start(ctx context.Context, workers int) {
	for range workers {
		c.wg.Go(func() { c.work(ctx) })
	}
}

func (c *checker) wait() { c.wg.Wait() }

func (c *checker) work(ctx context.Context) {
	// The stream handle caches the stream's info (AllowDirect decides the
	// kind of get); it is looked up again after any failure, in case the
	// stream was recreated.
	var stream jetstream.Stream
	for {
		var req checkRequest
		select {
		case req = <-c.reqs:
		case <-ctx.Done():
			return
		}
		res := checkResult{pod: req.pod}
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		if stream == nil {
			stream, res.err = lookUpStream(cctx, c.js, c.stream, req.subject)
		}
		if res.err == nil {
			res.seq, res.err = lastOnSubjectIs(cctx, stream, req.subject, req.id)
			if res.err != nil {
				stream = nil
			}
		}
		cancel()
		select {
		case c.results <- res:
		case <-ctx.Done():
			return
		}
	}
}

// lastOnSubjectIs returns the sequence of the last message stream holds on
// subject if it has the message id id, else 0 (also when the subject has
// no message).
func lastOnSubjectIs(ctx context.Context, stream jetstream.Stream, subject, id string) (uint64, error) {
	m, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get last message on %s: %w", subject, err)
	}
	if m.Header.Get(jetstream.MsgIDHeader) != id {
		return 0, nil
	}
	return m.Sequence, nil
}

// maybeStored reports whether a failed publish attempt may have been
// stored all the same. Only a publish that reached no stream at all (no
// responders, which nats.go reports as ErrNoStreamResponse after its own
// retries) proves it was not; an ack that timed out, a connection lost
// before the ack, or an error from a stream leader that was losing its
// leadership as it answered may all hide a stored message.
func maybeStored(err error) bool {
	return !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders)
}
