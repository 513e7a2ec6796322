package statebucket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Writer defaults.
const (
	// DefaultMarkerTTL is how long the delete marker of a removed
	// container stays in the state bucket. A watcher that is connected
	// sees it at once; one that reconnects resumes after the last entry it
	// saw and sees it as long as it is there, so this is the longest a
	// watcher may be away without keeping a removed container. A day of
	// markers is one small message per container removed that day.
	DefaultMarkerTTL = 24 * time.Hour
	// DefaultMaxDeletes bounds the deletes that wait while NATS is
	// away, beyond the node's live containers (which the writer holds
	// anyway). Past it they are forgotten and the node's keys are
	// reconciled instead once NATS is back: one read of the node's keys
	// replaces any number of deletes.
	DefaultMaxDeletes = 16384
)

// writeTimeout bounds one write to the bucket; a write that fails is
// retried with the Publisher's backoff bounds. readyInterval is how often
// the writer asks Ready while it has not reconciled yet.
const (
	writeTimeout  = 5 * time.Second
	readyInterval = 500 * time.Millisecond
)

// errReconnecting is the error of a write not tried while the connection
// reconnects.
var errReconnecting = errors.New("nats connection is reconnecting")

// Options configures a Writer. Zero values take the defaults.
type Options struct {
	// Bucket is the key-value bucket's name. Required.
	Bucket string
	// Encoder encodes the values: the events' CloudEvents, always in
	// structured mode whatever the Encoder's mode. Its node is the node
	// whose keys the writer owns. Required.
	Encoder *publish.Encoder
	// Manage creates the bucket if it is missing, with Replicas replicas
	// (0 means 1), history 1 and delete markers kept MarkerTTL. Without
	// it the writer waits for the bucket to exist.
	Manage   bool
	Replicas int
	// MarkerTTL is the marker TTL of a bucket the writer creates: how long
	// the marker of a deleted key stays; 0 means DefaultMarkerTTL.
	// The writer's purges take the TTL of the bucket it finds; a bucket
	// made without marker TTLs keeps the markers until a purge of deletes.
	MarkerTTL time.Duration
	// Version is the pleg-bridge version recorded, beside
	// schemas.ContractVersion, in the metadata of a bucket the writer
	// creates; empty means the main module's version in the build info.
	Version string
	// Seed holds what this node published before a restart (the
	// checkpoint's events): the containers it has in the bucket already.
	// The writer does not write them again, unless a reconcile finds the
	// bucket differs.
	Seed []generator.Event
	// Ready, if set, says when every event of the node's first relist has
	// been acked and recorded: then the writer reconciles the node's keys
	// once (it reads them back and rewrites the stale ones). nil: it never
	// reconciles unless it had to forget deletes.
	Ready func() bool
	// MaxDeletes bounds the deletes waiting to be written; 0 means
	// DefaultMaxDeletes.
	MaxDeletes int
	// RetryBackoffMin and RetryBackoffMax bound the wait before a failed
	// write is retried; zero takes the Publisher's defaults
	// (publish.DefaultRetryBackoffMin, publish.DefaultRetryBackoffMax).
	RetryBackoffMin, RetryBackoffMax time.Duration
	// DrainTimeout bounds the writes made once Run's ctx is done; 0 means
	// publish.DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger is tagged with component=state; nil logs nothing.
	Logger *slog.Logger
}

// Writer keeps the node's part of the state bucket equal to the
// node's containers as the stream tells them: one key per container
// (schemas.StateKey), whose value is the container's latest event as a
// structured CloudEvent, deleted (a purge, leaving a marker for
// MarkerTTL) when the container is removed.
//
// Record takes each event after JetStream acked it (publish.Options.OnAck), so the
// bucket never shows what the stream does not hold, and never blocks: it
// updates the writer's view of the node's live containers and marks the
// key dirty. Run writes the dirty keys one at a time, each with the
// container's value at the time of the write, so a key's writes follow
// its events' order and a burst of events for one container costs one
// write (coalescing by key). While NATS is away the dirty keys wait and
// are retried with capped backoff; the events are in the stream already,
// so nothing of the stream waits for the bucket. The memory held is the
// node's live containers plus at most MaxDeletes removed ones; past that
// the deletes are forgotten and the node's keys reconciled.
//
// Reconcile: once Ready says the first relist is acked, and after deletes
// were forgotten, the writer reads the node's keys and deletes those of
// containers it does not hold, writes those whose value differs, and
// writes those missing. That removes what an earlier run left behind: a
// delete a crash lost, or containers that went away while a bridge without
// a checkpoint was down.
//
// Record and Pending are safe for concurrent use.
type Writer struct {
	js      jetstream.JetStream
	opts    Options // defaults applied
	enc     *publish.Encoder
	node    string
	log     *slog.Logger
	metrics *metrics

	// wake has room for one signal: Record's, that a key is dirty.
	wake chan struct{}

	mu sync.Mutex
	// live holds the latest event of each container the node has, by
	// key; byID the key of each container ID. guarded by mu
	live map[string]generator.Event
	byID map[string]string
	// dirty holds the keys whose bucket entry may differ from live (a
	// key not in live is to be deleted); order holds them in the order
	// they became dirty. guarded by mu
	dirty map[string]struct{}
	order []string
	// resync is set when deletes were forgotten. guarded by mu
	resync bool
	// gone holds the containers whose ContainerRemoved was recorded, for
	// generator.DefaultTombstoneTTL, in goneOrder's order: an earlier
	// event of one recorded later (published again after the servers
	// lost it, and stored after its removal) must not bring its key back.
	// guarded by mu
	gone      map[string]struct{}
	goneOrder []goneEntry
}

type goneEntry struct {
	id string
	at time.Time
}

// New returns a Writer that writes with js. Run must be called for
// anything to be written.
func New(js jetstream.JetStream, opts Options) (*Writer, error) {
	if js == nil {
		return nil, errors.New("create state writer: jetstream handle is nil")
	}
	if opts.Encoder == nil {
		return nil, errors.New("create state writer: encoder is nil")
	}
	if opts.Bucket == "" {
		return nil, errors.New("create state writer: bucket name is empty")
	}
	if opts.MarkerTTL < 0 || opts.MaxDeletes < 0 || opts.Replicas < 0 {
		return nil, fmt.Errorf("create state writer: marker TTL %s, max deletes %d or replicas %d is negative",
			opts.MarkerTTL, opts.MaxDeletes, opts.Replicas)
	}
	if opts.MarkerTTL == 0 {
		opts.MarkerTTL = DefaultMarkerTTL
	}
	if opts.MarkerTTL < time.Second {
		return nil, fmt.Errorf("create state writer: marker TTL %s is below JetStream's minimum of 1s", opts.MarkerTTL)
	}
	if opts.MaxDeletes == 0 {
		opts.MaxDeletes = DefaultMaxDeletes
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.RetryBackoffMin == 0 {
		opts.RetryBackoffMin = publish.DefaultRetryBackoffMin
	}
	if opts.RetryBackoffMax == 0 {
		opts.RetryBackoffMax = publish.DefaultRetryBackoffMax
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = publish.DefaultDrainTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Writer{
		js:    js,
		opts:  opts,
		enc:   opts.Encoder,
		node:  opts.Encoder.Node(),
		log:   log.With("component", "state", "bucket", opts.Bucket),
		wake:  make(chan struct{}, 1),
		live:  map[string]generator.Event{},
		byID:  map[string]string{},
		dirty: map[string]struct{}{},
		gone:  map[string]struct{}{},
	}
	m, err := newMetrics(opts.Registerer, w.Pending)
	if err != nil {
		return nil, fmt.Errorf("create state writer: %w", err)
	}
	w.metrics = m
	w.seed(opts.Seed)
	return w, nil
}

// seed takes the latest event of each container in events as live, unless
// it is removed; no key becomes dirty.
func (w *Writer) seed(events []generator.Event) {
	latest := map[string]generator.Event{}
	for _, ev := range events {
		if cur, ok := latest[ev.Container.ID]; !ok || typeRank(ev.Type) > typeRank(cur.Type) {
			latest[ev.Container.ID] = ev
		}
	}
	now := time.Now()
	for id, ev := range latest {
		if ev.Type == generator.ContainerRemoved {
			w.buryLocked(id, now)
			continue
		}
		key := w.key(ev)
		w.live[key] = ev
		w.byID[id] = key
	}
}

// typeRank orders the Lifecycle event types as a container goes through
// them.
func typeRank(t generator.LifecycleEventType) int {
	switch t {
	case generator.ContainerStarted:
		return 1
	case generator.ContainerDied:
		return 2
	case generator.ContainerRemoved:
		return 3
	}
	return 0
}

// key returns the state bucket key of ev's container.
func (w *Writer) key(ev generator.Event) string {
	return schemas.StateKey(schemas.StateRef{
		Node: w.node, Namespace: ev.Pod.Namespace, Pod: ev.Pod.Name, PodUID: ev.Pod.UID, ContainerID: ev.Container.ID,
	})
}

// Record takes an event JetStream acked: its container's key becomes
// dirty, to hold the event, or to be deleted for a ContainerRemoved. An
// event older than what the writer holds for its container is ignored. It
// does no I/O and never blocks.
func (w *Writer) Record(ev generator.Event) {
	if ev.Container.ID == "" || ev.Pod.UID == "" {
		return // not encodable: the Publisher dropped it too
	}
	key := w.key(ev)
	w.mu.Lock()
	if _, gone := w.gone[ev.Container.ID]; gone && ev.Type != generator.ContainerRemoved {
		w.mu.Unlock()
		return
	}
	if old, ok := w.byID[ev.Container.ID]; ok && old != key {
		// The pod's identity became known after its first event: the
		// container moves to its new key.
		delete(w.live, old)
		w.markDirty(old, true)
	}
	if cur, ok := w.live[key]; ok && typeRank(cur.Type) > typeRank(ev.Type) {
		w.mu.Unlock()
		return
	}
	if ev.Type == generator.ContainerRemoved {
		delete(w.live, key)
		delete(w.byID, ev.Container.ID)
		w.buryLocked(ev.Container.ID, time.Now())
	} else {
		w.live[key] = ev
		w.byID[ev.Container.ID] = key
	}
	w.markDirty(key, true)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// markDirty marks key dirty. With bounded set, past MaxDeletes deletes
// waiting, it forgets them all and asks for a reconcile; a reconcile's
// own marks are not bounded (they are bounded by the node's keys in the
// bucket), or it would forget what it found. Call it with mu held.
func (w *Writer) markDirty(key string, bounded bool) {
	if _, ok := w.dirty[key]; ok {
		return
	}
	w.dirty[key] = struct{}{}
	w.order = append(w.order, key)
	if !bounded || len(w.dirty) <= len(w.live)+w.opts.MaxDeletes {
		return
	}
	kept := w.order[:0]
	forgot := 0
	for _, k := range w.order {
		if _, ok := w.live[k]; ok {
			kept = append(kept, k)
		} else {
			delete(w.dirty, k)
			forgot++
		}
	}
	clear(w.order[len(kept):])
	w.order = kept
	w.resync = true
	w.metrics.forgotten.Add(float64(forgot))
	w.log.Warn("too many deletes wait for the state bucket: forgetting them, the node's keys will be reconciled",
		"deletes", forgot)
}

// buryLocked records that container id was removed at now, and forgets
// the containers removed generator.DefaultTombstoneTTL before. The caller
// holds mu.
func (w *Writer) buryLocked(id string, now time.Time) {
	if _, ok := w.gone[id]; !ok {
		w.gone[id] = struct{}{}
		w.goneOrder = append(w.goneOrder, goneEntry{id: id, at: now})
	}
	n := 0
	for n < len(w.goneOrder) && now.Sub(w.goneOrder[n].at) > generator.DefaultTombstoneTTL {
		delete(w.gone, w.goneOrder[n].id)
		n++
	}
	w.goneOrder = w.goneOrder[n:]
}

// Resync makes Run read the node's keys again and write every one that
// differs from what the writer holds: after the NATS servers lost
// acknowledged writes (the publisher's repair found events lost), the
// bucket may have lost some too, or hold older values. It does not block.
func (w *Writer) Resync() {
	w.mu.Lock()
	w.resync = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Pending returns the number of keys waiting to be written.
func (w *Writer) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dirty)
}

// Run opens the bucket (creating it with Manage), then writes dirty keys
// until ctx is done, and then for at most DrainTimeout more. It retries
// while JetStream is unreachable or the bucket cannot be used (logged at
// Error: permissions, a stream that is not a bucket), since the stream
// does not depend on it. It returns nil once ctx is done.
func (w *Writer) Run(ctx context.Context) error {
	kv, purgeTTL, err := w.open(ctx)
	if err != nil {
		return nil // ctx is done
	}
	var reconnected chan nats.Status
	if nc := w.js.Conn(); nc != nil {
		reconnected = nc.StatusChanged(nats.CONNECTED)
		defer nc.RemoveStatusListener(reconnected)
	}
	reconciled := w.opts.Ready == nil
	reconcileFailures := 0
	var readyC <-chan time.Time
	if !reconciled {
		tick := time.NewTicker(readyInterval)
		defer tick.Stop()
		readyC = tick.C
	}
	failures := 0
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		w.mu.Lock()
		resync := w.resync
		w.mu.Unlock()
		if (!reconciled && w.opts.Ready() || resync) && failures == 0 {
			if w.markStaleKeysOrLog(ctx, kv, reconcileFailures) {
				reconciled, readyC, reconcileFailures = true, nil, 0
			} else {
				reconcileFailures++
			}
		}
		if err := w.writeDirty(ctx, kv, purgeTTL); err != nil {
			if ctx.Err() != nil {
				// Not a failure: the write was cut short by the stop.
				w.drain(ctx, kv, purgeTTL)
				return nil
			}
			failures++
			d := publish.RetryDelay(w.opts.RetryBackoffMin, w.opts.RetryBackoffMax, failures)
			if failures == 1 {
				w.log.Warn("cannot write the state bucket, will retry", "err", err, "retry_in", d)
			} else {
				w.log.Debug("cannot write the state bucket, will retry", "err", err, "retry_in", d)
			}
			// Go 1.23 timers: Reset and Stop need no draining.
			retry.Reset(d)
			select {
			case <-ctx.Done():
				w.drain(ctx, kv, purgeTTL)
				return nil
			case <-retry.C:
			case <-reconnected:
				retry.Stop()
				failures = 0
				if reconciled {
					w.Resync() // a server that restarted may have lost writes it acked
				}
			}
			continue
		}
		if failures > 0 {
			w.log.Info("state bucket writes resumed", "failed_attempts", failures)
			failures = 0
		}
		select {
		case <-ctx.Done():
			w.drain(ctx, kv, purgeTTL)
			return nil
		case <-w.wake:
		case <-reconnected:
			// A server that restarted may have lost writes it acked
			// (a power loss: nats-server flushes lazily).
			if reconciled {
				w.Resync()
			}
		case <-readyC:
		}
	}
}

// drain writes what is dirty once more, within DrainTimeout.
func (w *Writer) drain(ctx context.Context, kv jetstream.KeyValue, purgeTTL time.Duration) {
	if w.Pending() == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.DrainTimeout)
	defer cancel()
	if err := w.writeDirty(dctx, kv, purgeTTL); err != nil {
		w.log.Warn("state bucket keys left unwritten at shutdown; the next start reconciles them",
			"keys", w.Pending(), "err", err)
	}
}

// writeDirty writes the dirty keys in the order they became dirty, until
// none is left or a write fails (the key stays dirty).
func (w *Writer) writeDirty(ctx context.Context, kv jetstream.KeyValue, purgeTTL time.Duration) error {
	for {
		w.mu.Lock()
		if len(w.order) == 0 {
			w.mu.Unlock()
			return nil
		}
		key := w.order[0]
		w.order[0] = ""
		w.order = w.order[1:]
		delete(w.dirty, key)
		ev, live := w.live[key]
		w.mu.Unlock()

		err := w.write(ctx, kv, key, ev, live, purgeTTL)
		if err == nil {
			continue
		}
		var encErr encodeError
		if errors.As(err, &encErr) {
			w.log.Warn("cannot encode a container's state, leaving its key as it is",
				"key", key, "err", err)
			continue
		}
		w.mu.Lock()
		if _, ok := w.dirty[key]; !ok {
			w.dirty[key] = struct{}{}
			w.order = append([]string{key}, w.order...)
		}
		w.mu.Unlock()
		return err
	}
}

// encodeError is an event the Encoder refuses: its key is left as it is,
// not retried.
type encodeError struct{ error }

// write puts ev as key's value, or deletes key when it is not live.
func (w *Writer) write(ctx context.Context, kv jetstream.KeyValue, key string, ev generator.Event, live bool, purgeTTL time.Duration) error {
	op := "delete"
	var value []byte
	if live {
		op = "put"
		var err error
		value, err = w.enc.EncodeStructured(ev)
		if err != nil {
			return encodeError{err}
		}
	}
	if nc := w.js.Conn(); nc != nil && nc.IsReconnecting() {
		// A write nats.go buffers until the reconnect would wait out its
		// timeout anyway; retried once the connection is back.
		w.metrics.writes.WithLabelValues(op, resultError).Inc()
		return errReconnecting
	}
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	var err error
	if live {
		_, err = kv.Put(wctx, key, value)
	} else {
		var opts []jetstream.KVDeleteOpt
		if purgeTTL > 0 {
			opts = append(opts, jetstream.PurgeTTL(purgeTTL))
		}
		err = kv.Purge(wctx, key, opts...)
	}
	if err != nil {
		w.metrics.writes.WithLabelValues(op, resultError).Inc()
		return fmt.Errorf("%s state key %s: %w", op, key, err)
	}
	w.metrics.writes.WithLabelValues(op, resultOK).Inc()
	return nil
}
