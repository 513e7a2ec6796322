package publish

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// StateWriter defaults.
const (
	// DefaultStateMarkerTTL is how long the delete marker of a removed
	// container stays in the state bucket. A watcher that is connected
	// sees it at once; one that reconnects resumes after the last entry it
	// saw and sees it as long as it is there, so this is the longest a
	// watcher may be away without keeping a removed container. A day of
	// markers is one small message per container removed that day.
	DefaultStateMarkerTTL = 24 * time.Hour
	// DefaultStateMaxDeletes bounds the deletes that wait while NATS is
	// away, beyond the node's live containers (which the writer holds
	// anyway). Past it they are forgotten and the node's keys are
	// reconciled instead once NATS is back: one read of the node's keys
	// replaces any number of deletes.
	DefaultStateMaxDeletes = 16384
)

// stateWriteTimeout bounds one write to the bucket; a write that fails is
// retried with the Publisher's backoff bounds. stateReadyInterval is how
// often the writer asks Ready while it has not reconciled yet.
const (
	stateWriteTimeout  = 5 * time.Second
	stateReadyInterval = 500 * time.Millisecond
)

// StateOptions configures a StateWriter. Zero values take the defaults.
type StateOptions struct {
	// Bucket is the key-value bucket's name. Required.
	Bucket string
	// Encoder encodes the values: the events' CloudEvents, always in
	// structured mode whatever the Encoder's mode. Its node is the node
	// whose keys the writer owns. Required.
	Encoder *Encoder
	// Manage creates the bucket if it is missing, with Replicas replicas
	// (0 means 1), history 1 and delete markers kept MarkerTTL. Without
	// it the writer waits for the bucket to exist.
	Manage   bool
	Replicas int
	// MarkerTTL is the marker TTL of a bucket the writer creates: how long
	// the marker of a deleted key stays; 0 means DefaultStateMarkerTTL.
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
	// once (reconcile below). nil: it never reconciles unless it had to
	// forget deletes.
	Ready func() bool
	// MaxDeletes bounds the deletes waiting to be written; 0 means
	// DefaultStateMaxDeletes.
	MaxDeletes int
	// RetryBackoffMin and RetryBackoffMax bound the wait before a failed
	// write is retried; zero takes the Publisher's defaults.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// DrainTimeout bounds the writes made once Run's ctx is done; 0 means
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger is tagged with component=state; nil logs nothing.
	Logger *slog.Logger
}

// StateWriter keeps the node's part of the state bucket equal to the
// node's containers as the stream tells them: one key per container
// (schemas.StateKey), whose value is the container's latest event as a
// structured CloudEvent, deleted (a purge, leaving a marker for
// MarkerTTL) when the container is removed.
//
// Record takes each event after JetStream acked it (Options.OnAck), so the
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
type StateWriter struct {
	js      jetstream.JetStream
	opts    StateOptions // defaults applied
	enc     *Encoder     // structured
	node    string
	log     *slog.Logger
	metrics *stateMetrics

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
}

// NewStateWriter returns a StateWriter that writes with js. Run must be
// called for anything to be written.
func NewStateWriter(js jetstream.JetStream, opts StateOptions) (*StateWriter, error) {
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
		opts.MarkerTTL = DefaultStateMarkerTTL
	}
	if opts.MarkerTTL < time.Second {
		return nil, fmt.Errorf("create state writer: marker TTL %s is below JetStream's minimum of 1s", opts.MarkerTTL)
	}
	if opts.MaxDeletes == 0 {
		opts.MaxDeletes = DefaultStateMaxDeletes
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.RetryBackoffMin == 0 {
		opts.RetryBackoffMin = DefaultRetryBackoffMin
	}
	if opts.RetryBackoffMax == 0 {
		opts.RetryBackoffMax = DefaultRetryBackoffMax
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	enc := *opts.Encoder // shares its read-only maps
	enc.mode = ModeStructured
	w := &StateWriter{
		js:    js,
		opts:  opts,
		enc:   &enc,
		node:  enc.node,
		log:   log.With("component", "state", "bucket", opts.Bucket),
		wake:  make(chan struct{}, 1),
		live:  map[string]generator.Event{},
		byID:  map[string]string{},
		dirty: map[string]struct{}{},
	}
	m, err := newStateMetrics(opts.Registerer, w.Pending)
	if err != nil {
		return nil, fmt.Errorf("create state writer: %w", err)
	}
	w.metrics = m
	w.seed(opts.Seed)
	return w, nil
}

// seed takes the latest event of each container in events as live, unless
// it is removed; no key becomes dirty.
func (w *StateWriter) seed(events []generator.Event) {
	latest := map[string]generator.Event{}
	for _, ev := range events {
		if cur, ok := latest[ev.Container.ID]; !ok || typeRank(ev.Type) > typeRank(cur.Type) {
			latest[ev.Container.ID] = ev
		}
	}
	for id, ev := range latest {
		if ev.Type == generator.ContainerRemoved {
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
func (w *StateWriter) key(ev generator.Event) string {
	return schemas.StateKey(schemas.StateRef{
		Node: w.node, Namespace: ev.Pod.Namespace, Pod: ev.Pod.Name, PodUID: ev.Pod.UID, ContainerID: ev.Container.ID,
	})
}

// Record takes an event JetStream acked: its container's key becomes
// dirty, to hold the event, or to be deleted for a ContainerRemoved. An
// event older than what the writer holds for its container is ignored. It
// does no I/O and never blocks.
func (w *StateWriter) Record(ev generator.Event) {
	if ev.Container.ID == "" || ev.Pod.UID == "" {
		return // not encodable: the Publisher dropped it too
	}
	key := w.key(ev)
	w.mu.Lock()
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
func (w *StateWriter) markDirty(key string, bounded bool) {
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

// Pending returns the number of keys waiting to be written.
func (w *StateWriter) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dirty)
}

// Run opens the bucket (creating it with Manage), then writes dirty keys
// until ctx is done, and then for at most DrainTimeout more. It retries
// while JetStream is unreachable or the bucket cannot be used (logged at
// Error: permissions, a stream that is not a bucket), since the stream
// does not depend on it. It returns nil once ctx is done.
func (w *StateWriter) Run(ctx context.Context) error {
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
		tick := time.NewTicker(stateReadyInterval)
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
			if w.reconcileOrLog(ctx, kv, reconcileFailures) {
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
			d := retryDelay(w.opts.RetryBackoffMin, w.opts.RetryBackoffMax, failures)
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
		case <-readyC:
		}
	}
}

// drain writes what is dirty once more, within DrainTimeout.
func (w *StateWriter) drain(ctx context.Context, kv jetstream.KeyValue, purgeTTL time.Duration) {
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

// open returns the bucket, created with Manage if missing, and the TTL to
// give delete markers (0 when the bucket has no marker TTLs). It retries
// while JetStream is unreachable (or the bucket missing, without Manage).
func (w *StateWriter) open(ctx context.Context) (jetstream.KeyValue, time.Duration, error) {
	failures := 0
	for {
		kv, err := w.openOnce(ctx)
		var st jetstream.KeyValueStatus
		if err == nil {
			st, err = kv.Status(ctx)
			if err == nil {
				// The bucket's own marker TTL, also for one an operator
				// made: the purges' markers live as long as its others.
				ttl := st.LimitMarkerTTL()
				if ttl == 0 {
					w.log.Warn("the state bucket has no marker TTL: markers of removed containers stay until its deletes are purged")
				}
				w.log.Info("state bucket ready", "node", w.node)
				return kv, ttl, nil
			}
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		failures++
		d := retryDelay(w.opts.RetryBackoffMin, w.opts.RetryBackoffMax, failures)
		switch {
		case !stateUnreachable(err):
			// Permissions, a bucket that is not one: an operator must
			// act. The stream does not depend on the bucket, so the
			// bridge goes on, and so does the writer, slowly.
			d = w.opts.RetryBackoffMax
			if failures == 1 {
				w.log.Error("cannot use the state bucket, will retry", "err", err, "retry_in", d)
			}
		case failures == 1:
			w.log.Warn("cannot open the state bucket, will retry", "err", err, "retry_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, ctx.Err()
		case <-t.C:
		}
	}
}

func (w *StateWriter) openOnce(ctx context.Context) (jetstream.KeyValue, error) {
	cctx, cancel := context.WithTimeout(ctx, stateWriteTimeout)
	defer cancel()
	return EnsureStateBucket(cctx, w.js, w.opts)
}

// EnsureStateBucket returns the state bucket opts.Bucket and, with
// opts.Manage, creates it if it is missing: history 1 (one message per
// key), file storage, opts.Replicas replicas, and delete markers kept
// opts.MarkerTTL (0: DefaultStateMarkerTTL), and the contract version and
// opts.Version in its metadata (schemas.MetadataContractVersion,
// schemas.MetadataVersion). An existing bucket is used as it is, its
// metadata included: a bridge's user may only create the bucket, and the
// bucket's keys, unlike the stream's subjects, have not changed with the
// contract so far. Only Bucket, Manage, Replicas, MarkerTTL and Version of
// opts are read. It makes one attempt; StateWriter.Run calls it until it
// succeeds.
func EnsureStateBucket(ctx context.Context, js jetstream.JetStream, opts StateOptions) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, opts.Bucket)
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !opts.Manage {
		return kv, err
	}
	kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         opts.Bucket,
		Description:    "pleg-bridge: the latest lifecycle event of every container, one key per container",
		History:        1,
		Replicas:       max(opts.Replicas, 1),
		Storage:        jetstream.FileStorage,
		LimitMarkerTTL: cmp.Or(opts.MarkerTTL, DefaultStateMarkerTTL),
		Metadata:       contractMetadata(opts.Version),
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		// Another node created it meanwhile.
		return js.KeyValue(ctx, opts.Bucket)
	}
	return kv, err
}

// stateUnreachable reports whether err means the bucket cannot be reached
// (yet), rather than one the writer cannot use.
func stateUnreachable(err error) bool {
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return true
	}
	for _, target := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders,
		nats.ErrDisconnected, nats.ErrConnectionReconnecting, jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// writeDirty writes the dirty keys in the order they became dirty, until
// none is left or a write fails (the key stays dirty).
func (w *StateWriter) writeDirty(ctx context.Context, kv jetstream.KeyValue, purgeTTL time.Duration) error {
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

type encodeError struct{ error }

// write puts ev as key's value, or deletes key when it is not live.
func (w *StateWriter) write(ctx context.Context, kv jetstream.KeyValue, key string, ev generator.Event, live bool, purgeTTL time.Duration) error {
	op := "delete"
	var value []byte
	if live {
		op = "put"
		msg, err := w.enc.Encode(ev)
		if err != nil {
			return encodeError{err}
		}
		value = msg.Data
	}
	if nc := w.js.Conn(); nc != nil && nc.IsReconnecting() {
		// A write nats.go buffers until the reconnect would wait out its
		// timeout anyway; retried once the connection is back.
		w.metrics.writes.WithLabelValues(op, resultError).Inc()
		return errReconnecting
	}
	wctx, cancel := context.WithTimeout(ctx, stateWriteTimeout)
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
	w.metrics.writes.WithLabelValues(op, "ok").Inc()
	return nil
}

// reconcileOrLog reconciles, logging a failure (at Warn the first after a
// success, at Debug the next ones); it reports success.
func (w *StateWriter) reconcileOrLog(ctx context.Context, kv jetstream.KeyValue, failedBefore int) bool {
	n, err := w.reconcile(ctx, kv)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case failedBefore == 0:
			w.log.Warn("cannot reconcile the node's keys in the state bucket, will try again", "err", err)
		default:
			w.log.Debug("cannot reconcile the node's keys in the state bucket, will try again", "err", err)
		}
		return false
	}
	w.metrics.reconciles.Inc()
	w.log.Info("reconciled the node's keys in the state bucket", "keys_to_write", n)
	return true
}

// reconcile reads the node's keys and their values, and marks dirty every
// key whose value differs from what the writer holds (missing, stale, or
// of a container it does not hold). It returns how many it marked.
func (w *StateWriter) reconcile(ctx context.Context, kv jetstream.KeyValue) (int, error) {
	w.mu.Lock()
	w.resync = false
	snapshot := make(map[string]generator.Event, len(w.live))
	for k, ev := range w.live {
		snapshot[k] = ev
	}
	w.mu.Unlock()

	stored, err := readKeys(ctx, kv, schemas.StateKeyFilter(schemas.StateRef{Node: w.node}))
	if err != nil {
		w.mu.Lock()
		w.resync = true
		w.mu.Unlock()
		return 0, err
	}
	var stale []string
	for key, value := range stored {
		ev, ok := snapshot[key]
		if !ok || storedEventID(value) != EventID(ev.Container.ID, ev.Type) {
			stale = append(stale, key)
		}
	}
	for key := range snapshot {
		if _, ok := stored[key]; !ok {
			stale = append(stale, key)
		}
	}
	// A key whose container changed since the snapshot is dirty already
	// or written with its current value: marking it again costs at most
	// one write.
	w.mu.Lock()
	for _, key := range stale {
		w.markDirty(key, false)
	}
	w.mu.Unlock()
	if len(stale) > 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return len(stale), nil
}

// storedEventID returns the CloudEvent id of a stored value, "" if it has
// none. A key is up to date when it holds the writer's event: the id names
// the container and the event type, and nothing else. The bytes are not
// compared: a value written by a run whose events carried more (a field
// the checkpoint does not keep, which the writer's seed then lacks) is the
// same event and stays as it is.
func storedEventID(value []byte) string {
	var ce struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(value, &ce) != nil {
		return ""
	}
	return ce.ID
}

// readKeys returns the values of the keys of kv that match filter, deleted
// ones left out, as they are when it is called.
func readKeys(ctx context.Context, kv jetstream.KeyValue, filter string) (map[string][]byte, error) {
	rctx, cancel := context.WithTimeout(ctx, stateWriteTimeout)
	defer cancel()
	watcher, err := kv.Watch(rctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer watcher.Stop()
	out := map[string][]byte{}
	for {
		select {
		case e, ok := <-watcher.Updates():
			if !ok {
				return nil, errors.New("read state keys: watcher stopped")
			}
			if e == nil {
				return out, nil
			}
			out[e.Key()] = e.Value()
		case <-rctx.Done():
			return nil, fmt.Errorf("read state keys: %w", rctx.Err())
		}
	}
}

// stateMetrics are the StateWriter's collectors.
type stateMetrics struct {
	writes     *prometheus.CounterVec
	reconciles prometheus.Counter
	forgotten  prometheus.Counter
}

func newStateMetrics(reg prometheus.Registerer, pending func() int) (*stateMetrics, error) {
	m := &stateMetrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_state_writes_total",
			Help: "Writes to the state bucket by operation (put, delete) and result (ok, error: retried).",
		}, []string{"operation", "result"}),
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_state_reconciles_total",
			Help: "Reconciles of the node's keys in the state bucket with the containers the bridge holds.",
		}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_state_deletes_forgotten_total",
			Help: "Deletes of state keys forgotten for want of room while NATS was away, left to a reconcile.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	pendingGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_bridge_state_pending_keys",
		Help: "State bucket keys waiting to be written.",
	}, func() float64 { return float64(pending()) })
	for _, c := range []prometheus.Collector{m.writes, m.reconciles, m.forgotten, pendingGauge} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register state metrics: %w", err)
		}
	}
	return m, nil
}
