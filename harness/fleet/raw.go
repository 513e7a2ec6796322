package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The raw publisher is the baseline of the bridges' publish→ack times: a
// process of its own that publishes, at a steady rate, copies of events
// the bridges stored (the same subjects but for the first token, the same
// headers and data) with nats.go's asynchronous JetStream publish and
// nothing else: no outbox, no spool, no ordering. Its stream has the
// event stream's configuration and, where the servers agree, its leader.
// The harness asks it at each window's end for the acks of the window.

const (
	// rawStream is the baseline's stream, rawPrefix its subjects' first
	// token in place of the events' prefix.
	rawStream = "FLEET_RAW"
	rawPrefix = "fleetraw"
	// rawTemplates is how many stored events the baseline copies.
	rawTemplates = 256
	// rawTick is how often the raw publisher publishes what its rate
	// has accumulated.
	rawTick = 10 * time.Millisecond
	// rawMaxPending is nats.go's bound on its publishes in flight, as
	// the bridge's (publish.DefaultMaxInFlight).
	rawMaxPending = 1024
	// rawAckTimeout is the bridges' ack timeout (publish's default): a
	// publish not acked in it is an error here as there.
	rawAckTimeout = 5 * time.Second
)

// rawSpec is the raw publisher's spec. The messages to copy are in a
// file (JSON, []rawMessage): the spec travels in the environment, where
// one variable holds 128 KiB at most.
type rawSpec struct {
	URLs     string
	Rate     float64 // messages per second
	Messages string  // the file of the messages to copy
}

// rawMessage is one stored event to copy: its subject (already under
// rawPrefix), headers and data.
type rawMessage struct {
	Subject string
	Header  nats.Header
	Data    []byte
}

// rawStats is the raw publisher's answer: the acks and errors since the
// last request, each ack's time in nanoseconds.
type rawStats struct {
	Acks   []int64
	Errors int
}

// rawPublisher publishes its messages round-robin and keeps each outcome
// until it is asked.
type rawPublisher struct {
	msgs []rawMessage

	mu     sync.Mutex
	sent   map[string]time.Time // by message ID, in flight; guarded by mu
	acks   []int64              // guarded by mu
	errors int                  // guarded by mu
}

// runRaw runs the raw publisher until ctx ends or stdin does.
func runRaw(ctx context.Context, spec rawSpec, lines <-chan string, stdout io.Writer) error {
	b, err := os.ReadFile(spec.Messages)
	if err != nil {
		return fmt.Errorf("raw publisher: %w", err)
	}
	var msgs []rawMessage
	if err := json.Unmarshal(b, &msgs); err != nil {
		return fmt.Errorf("raw publisher: read %s: %w", spec.Messages, err)
	}
	if len(msgs) == 0 || spec.Rate <= 0 {
		return fmt.Errorf("raw publisher: %d messages at %v/s: nothing to publish", len(msgs), spec.Rate)
	}
	nc, err := nats.Connect(spec.URLs, nats.Name("fleet raw publisher"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("raw publisher: connect to %s: %w", spec.URLs, err)
	}
	defer nc.Close()
	r := &rawPublisher{msgs: msgs, sent: map[string]time.Time{}}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
			r.done(m, time.Now(), true)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, _ error) {
			r.done(m, time.Now(), false)
		}),
		jetstream.WithPublishAsyncTimeout(rawAckTimeout),
		jetstream.WithPublishAsyncMaxPending(rawMaxPending),
	)
	if err != nil {
		return fmt.Errorf("raw publisher: %w", err)
	}
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	t := time.NewTicker(rawTick)
	defer t.Stop()
	last, owed, seq := time.Now(), 0.0, 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-lines:
			if !ok {
				return nil
			}
			if err := enc.Encode(r.take()); err != nil {
				return err
			}
		case now := <-t.C:
			owed += now.Sub(last).Seconds() * spec.Rate
			last = now
			for ; owed >= 1; owed-- {
				seq++
				r.publish(js, seq)
			}
		}
	}
}

// publish publishes the seq'th message: a template with a message ID of
// its own, as each event of the bridges has.
func (r *rawPublisher) publish(js jetstream.JetStream, seq int) {
	t := r.msgs[seq%len(r.msgs)]
	id := "raw-" + strconv.Itoa(seq)
	h := nats.Header{}
	for k, v := range t.Header {
		h[k] = v
	}
	h.Set(jetstream.MsgIDHeader, id)
	m := &nats.Msg{Subject: t.Subject, Header: h, Data: t.Data}
	r.mu.Lock()
	r.sent[id] = time.Now()
	r.mu.Unlock()
	if _, err := js.PublishMsgAsync(m); err != nil {
		r.mu.Lock()
		delete(r.sent, id)
		r.errors++
		r.mu.Unlock()
	}
}

// done records the outcome of m.
func (r *rawPublisher) done(m *nats.Msg, at time.Time, acked bool) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	r.mu.Lock()
	defer r.mu.Unlock()
	sent, ok := r.sent[id]
	if !ok {
		return
	}
	delete(r.sent, id)
	if !acked {
		r.errors++
		return
	}
	r.acks = append(r.acks, int64(at.Sub(sent)))
}

// take returns the outcomes since the last take.
func (r *rawPublisher) take() rawStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := rawStats{Acks: r.acks, Errors: r.errors}
	r.acks, r.errors = nil, 0
	return st
}

// rawSubject is an event's subject under rawPrefix: its first token (the
// events' prefix) replaced, the rest kept.
func rawSubject(subject string) string {
	_, rest, _ := strings.Cut(subject, ".")
	return rawPrefix + "." + rest
}

// startRaw sets up the baseline's stream like the event stream, with its
// leader where the event stream's is if the servers agree, copies up to
// rawTemplates of the stored events, and starts the raw publisher at
// rate. The bridges must have stored their first relists.
func (f *fleet) startRaw(ctx context.Context, rate float64) error {
	ictx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
	defer cancel()
	ev, err := f.js.Stream(ictx, streamName)
	if err != nil {
		return fmt.Errorf("baseline: read stream %s: %w", streamName, err)
	}
	cfg := ev.CachedInfo().Config
	cfg.Name, cfg.Subjects, cfg.Description = rawStream, []string{rawPrefix + ".>"}, "the fleet harness's raw publisher: the baseline of publish→ack"
	cfg.Sources, cfg.Mirror, cfg.SubjectTransform, cfg.RePublish, cfg.Metadata = nil, nil, nil, nil, nil
	raw, err := f.js.CreateOrUpdateStream(ictx, cfg)
	if err != nil {
		return fmt.Errorf("baseline: create stream %s: %w", rawStream, err)
	}
	if leader := leaderOf(ev); leader != "" && leaderOf(raw) != leader {
		f.moveLeader(ictx, leader)
	}
	var msgs []rawMessage
	last := ev.CachedInfo().State.LastSeq
	for seq := uint64(1); seq <= last && len(msgs) < rawTemplates; seq++ {
		m, err := ev.GetMsg(ictx, seq)
		if err != nil {
			return fmt.Errorf("baseline: read event %d of %s: %w", seq, streamName, err)
		}
		msgs = append(msgs, rawMessage{Subject: rawSubject(m.Subject), Header: m.Header, Data: m.Data})
	}
	if len(msgs) == 0 {
		return fmt.Errorf("baseline: stream %s holds no event to copy", streamName)
	}
	spec := rawSpec{URLs: strings.Join(f.servers.urls, ","), Rate: rate, Messages: filepath.Join(f.opts.Dir, "raw-messages.json")}
	b, err := json.Marshal(msgs)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if err := os.WriteFile(spec.Messages, b, 0o644); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	p, err := newProcess("raw", f.opts.ChildCommand, childSpec{Role: roleRaw, Raw: &spec}, filepath.Join(f.opts.Dir, "raw.log"))
	if err != nil {
		return err
	}
	f.raw = p
	return p.StartReady(ctx, time.Minute)
}

// stopRaw stops the raw publisher and deletes its stream, so that the
// servers' disk and the stream figures at the end are the fleet's alone.
func (f *fleet) stopRaw(ctx context.Context) {
	f.raw.Kill()
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := f.js.DeleteStream(ictx, rawStream); err != nil {
		f.logger.Warn("baseline: delete the raw stream; the servers' disk at the end counts it", "stream", rawStream, "err", err)
	}
}

// moveLeader asks the baseline's stream to elect leader as its leader, so
// that both streams' writes wait on the same server's disk and CPU. It is
// a wish: nats-server may elect another, which the report then says.
func (f *fleet) moveLeader(ctx context.Context, leader string) {
	req, _ := json.Marshal(map[string]any{"placement": map[string]any{"preferred": leader}})
	if _, err := f.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+rawStream, req); err != nil {
		f.logger.Warn("baseline: move the raw stream's leader", "to", leader, "err", err)
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s, err := f.js.Stream(ctx, rawStream); err == nil && leaderOf(s) == leader {
			return
		}
		if err := f.runner.Wait(ctx, sampleEvery); err != nil {
			return
		}
	}
}

func leaderOf(s jetstream.Stream) string {
	if cl := s.CachedInfo().Cluster; cl != nil {
		return cl.Leader
	}
	return ""
}

// ackWindow is what one window's acks were: the bridges' histogram, the
// raw publisher's exact times (sorted) and its errors.
type ackWindow struct {
	bridges   ackHist
	raw       []time.Duration
	rawErrors int
}

// closeAcks asks the bridge processes and the raw publisher for the acks
// since the last call and records them as the last window's. A process
// that does not answer (killed, not ready again) is left out of this
// window: its acks since its last answer are lost to the figures.
func (f *fleet) closeAcks(ctx context.Context) {
	var w ackWindow
	if f.ackPrev == nil {
		f.ackPrev = map[*bridgeGroup]ackHist{}
	}
	for _, g := range f.groups {
		var st childStats
		if err := g.proc.Request(ctx, requestAcks, &st); err != nil {
			continue
		}
		w.bridges = w.bridges.plus(st.Acks.since(f.ackPrev[g]))
		f.ackPrev[g] = st.Acks
	}
	if f.raw != nil {
		var st rawStats
		if err := f.raw.Request(ctx, "acks", &st); err != nil {
			f.prog.Problem("baseline: ask the raw publisher: %v", err)
		}
		for _, ns := range st.Acks {
			w.raw = append(w.raw, time.Duration(ns))
		}
		slices.Sort(w.raw)
		w.rawErrors = st.Errors
	}
	f.acks = append(f.acks, w)
}
