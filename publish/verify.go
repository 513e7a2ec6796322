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
// for clocks and queues between our send and the server's store), and for
// every spool entry an earlier process left (it may have been published,
// its ack lost in the crash), the publisher asks the stream first: the last
// message on the event's exact subject, compared by Nats-Msg-Id. If it is
// this event, the event is delivered and is not published again.
//
// Why the last message on the exact subject suffices: the subject is
// <prefix>.<node>.<podUID>.<eventType>, so only this node's publisher
// writes it, and it keeps at most one message per pod in flight: a later
// message on that subject is published only after this one was acked, which
// it was not. If the stored copy landed after the check (it was still in a
// queue), it is younger than the window when the re-send arrives, and
// JetStream drops the re-send as a duplicate.
//
// An expected-last-subject-sequence condition on every publish would make
// the publication idempotent with no read, but it needs the subject's last
// sequence before each publish (a read per pod after every restart, and
// state per subject) and turns a concurrent writer or a purge into errors
// that stall a pod. The check costs one get per retry that is this old, and
// per earlier spool entry; nothing on the normal path.
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
// Crash window: a spool entry acked and marked Done, with a later event of
// the same pod and type acked too, all within the spool's write interval
// (100 ms) before a crash, is found again at the restart with the later
// event last on its subject; if the restart comes after the duplicate
// window, the entry is stored a second time.

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

// checkResult answers a checkRequest: stored, or an error when the stream
// could not be asked.
type checkResult struct {
	pod    *podQueue
	stored bool
	err    error
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
			stream, res.err = c.lookUp(cctx, req.subject)
		}
		if res.err == nil {
			res.stored, res.err = lastOnSubjectIs(cctx, stream, req.subject, req.id)
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

// lookUp returns the stream named in Options.Stream, or else the one whose
// subjects take subject.
func (c *checker) lookUp(ctx context.Context, subject string) (jetstream.Stream, error) {
	name := c.stream
	if name == "" {
		n, err := c.js.StreamNameBySubject(ctx, subject)
		if err != nil {
			return nil, fmt.Errorf("look up the stream of %s: %w", subject, err)
		}
		name = n
	}
	s, err := c.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", name, err)
	}
	return s, nil
}

// lastOnSubjectIs reports whether the last message stream holds on subject
// has the message id id. No message on the subject means false.
func lastOnSubjectIs(ctx context.Context, stream jetstream.Stream, subject, id string) (bool, error) {
	m, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get last message on %s: %w", subject, err)
	}
	return m.Header.Get(jetstream.MsgIDHeader) == id, nil
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
