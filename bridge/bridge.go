package bridge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/statebucket"
)

// httpShutdownTimeout bounds the wait for the scrapes and probes in flight
// when the HTTP endpoint stops.
const httpShutdownTimeout = 5 * time.Second

// reconcileClockMargin is taken off the durable store's creation time (the
// node's clock) to start the read of what this node stored before its first
// checkpoint write (the server's clock): clocks a minute apart still miss
// nothing, and a node name reused within that minute only reads a few more
// messages, whose containers the generator then knows.
const reconcileClockMargin = time.Minute

// httpReadHeaderTimeout bounds a request's headers: the endpoint is for
// Prometheus and the kubelet, which send theirs at once.
const httpReadHeaderTimeout = 5 * time.Second

// Bridge is pleg-bridge on one node: the generator reading the runtime, the
// publisher writing to JetStream, the durable state between them and the
// HTTP endpoint, run by Run.
type Bridge struct {
	opts Options // defaults applied
	ran  atomic.Bool
	// p is the pipeline Run built; nil before. Status reads it.
	p atomic.Pointer[pipeline]
}

// New checks opts and applies the defaults. It does no I/O: Run opens and
// connects everything. The errors name the option at fault.
func New(opts Options) (*Bridge, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	return &Bridge{opts: opts.withDefaults()}, nil
}

// Status is a snapshot of a running bridge, for callers that wait for it to
// settle (the latency benchmark) or report on it.
type Status struct {
	// Built is true once Run has opened and built everything; the other
	// fields are zero before.
	Built bool
	// Synced is true once the first relist is merged.
	Synced bool
	// Mode is the generator's active mode: evented or generic.
	Mode generator.Mode
	// Pending counts the events the publisher recorded and JetStream has
	// not acknowledged yet, in memory and in the spool.
	Pending int
}

// Status returns the bridge's status. It is safe for concurrent use, also
// with Run.
func (b *Bridge) Status() Status {
	p := b.p.Load()
	if p == nil {
		return Status{}
	}
	return Status{Built: true, Synced: p.gen.Synced(), Mode: p.gen.Mode(), Pending: p.pub.Pending()}
}

// Run runs the bridge until ctx is done or a component fails, and returns
// once everything it started has stopped.
//
// Start order: the HTTP listener is bound first, so that the commonest
// failure (the port is taken) returns before anything else is started;
// then the durable store is opened (it fails at once if another process
// holds it), the runtime client made, NATS connected (or the embedded
// server started), and the generator, publisher, store writer and HTTP
// server run. An error in any of these steps closes what the earlier ones
// opened before Run returns it.
//
// Shutdown order: the generator stops first; the publisher delivers what
// is pending within Options.ShutdownTimeout; the durable store writes a
// last time (the acks of that delivery included); NATS is closed; the HTTP
// endpoint stops last, so that probes are answered while the bridge drains.
//
// Run returns nil after ctx is done, or the first error: a component's, a
// stream the bridge must not manage, the listen error. Run may be called
// once.
func (b *Bridge) Run(ctx context.Context) error {
	if !b.ran.CompareAndSwap(false, true) {
		return errors.New("run bridge: Run was called before")
	}
	var lis net.Listener
	if b.opts.ListenAddress != "" {
		var err error
		lis, err = net.Listen("tcp", b.opts.ListenAddress)
		if err != nil {
			return &ListenError{Option: OptionListenAddress, Err: fmt.Errorf("listen for metrics and health on %s: %w", b.opts.ListenAddress, err)}
		}
	}
	p, err := build(b.opts)
	if err != nil {
		if lis != nil {
			lis.Close()
		}
		return err
	}
	defer p.close()
	b.p.Store(p)
	return p.run(ctx, lis)
}

// Options whose address a ListenError names.
const (
	OptionListenAddress  = "ListenAddress"
	OptionEmbeddedListen = "NATS.EmbeddedListen"
)

// ListenError is Run's error when it cannot bind an address of its
// options: the HTTP endpoint's or the embedded NATS server's, typically
// because the port is taken. Its message names the address; Option names
// the option, so that a command can name its own setting for it.
type ListenError struct {
	// Option is OptionListenAddress or OptionEmbeddedListen.
	Option string
	Err    error
}

func (e *ListenError) Error() string { return e.Err.Error() }
func (e *ListenError) Unwrap() error { return e.Err }

// pipeline is what one Run opened and built.
type pipeline struct {
	opts  Options
	reg   *prometheus.Registry
	store *datadir.Store // nil without a data directory
	cri   *cri.Client
	// containerd is the client of containerd's own API when it has its
	// own endpoint (Options.ContainerdEndpoint); nil means cri serves it.
	containerd *cri.Client
	ns         *server.Server // the embedded NATS server; nil with a NATS URL
	nc         *nats.Conn
	js         jetstream.JetStream
	gen        *generator.Generator
	pub        *publish.Publisher
	state      *statebucket.Writer // nil without Options.StateBucket
	refused    *refusals           // what NATS refused that a setting fixes
}

// build opens the durable store, makes the runtime client, connects NATS,
// and builds the generator, the state bucket's writer and the publisher,
// each step from what the steps before it made. On error it closes what it
// opened.
//
// The publisher comes last because it takes from the two built before it:
// it restores into the generator what it reads back and records each ack
// in the state bucket's writer. They reach it the other way (the
// generator sends to it, the writer asks what is pending) through a
// publisherSlot, set once the publisher is built.
func build(opts Options) (_ *pipeline, err error) {
	opts = withNodeCredentials(opts)
	p := &pipeline{opts: opts, reg: opts.Registry, refused: newRefusals(opts)}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.reg == nil {
		p.reg = prometheus.NewRegistry()
	}
	if err := p.openStore(); err != nil {
		return nil, err
	}
	if err := p.dialRuntime(); err != nil {
		return nil, err
	}
	if err := p.connect(); err != nil {
		return nil, err
	}
	enc, err := newEncoder(opts)
	if err != nil {
		return nil, err
	}
	slot := new(publisherSlot)
	if err := p.buildGenerator(slot); err != nil {
		return nil, err
	}
	if err := p.buildStateWriter(enc, slot); err != nil {
		return nil, err
	}
	pubOpts := p.publisherOptions(enc, p.spool(), p.restart(), p.acked())
	if p.pub, err = publish.New(p.nc, pubOpts); err != nil {
		return nil, err
	}
	slot.set(p.pub)
	opts.Logger.Info("bridge running", "node", opts.Node, "cri_endpoint", opts.CRIEndpoint, "mode", string(cmp.Or(opts.Mode, generator.DefaultMode)),
		"stream", opts.Stream.Name, "subject_prefix", opts.SubjectPrefix, "state_bucket", opts.StateBucket, "data_dir", opts.DataDir)
	return p, nil
}

// openStore opens the durable store in Options.DataDir; without one there
// is none.
func (p *pipeline) openStore() (err error) {
	if p.opts.DataDir == "" {
		return nil
	}
	p.store, err = datadir.Open(p.opts.DataDir, datadir.Options{
		Node: p.opts.Node, SpoolMaxBytes: p.opts.SpoolMaxBytes, Logger: p.opts.Logger,
		RetainWindow: p.opts.repairWindow(), RetainMaxBytes: cmp.Or(p.opts.RepairMaxBytes, DefaultRepairMaxBytes),
	})
	return err
}

// spool returns the durable store's spool, or nil without a store or a
// spool.
func (p *pipeline) spool() *datadir.Spool {
	if p.store == nil {
		return nil
	}
	return p.store.Spool()
}

// dialRuntime makes the CRI client and registers its listing metrics, and
// makes the client of containerd's own API when that has an endpoint of its
// own (Options.ContainerdEndpoint).
func (p *pipeline) dialRuntime() (err error) {
	criOpts := p.opts.CRI
	criOpts.PodAnnotations = p.opts.PodAnnotations // the listings keep no others
	if p.cri, err = cri.NewClient(p.opts.CRIEndpoint, criOpts); err != nil {
		return err
	}
	if err := registerListedItems(p.reg, p.cri); err != nil {
		return err
	}
	warnMissingSocket(p.opts.CRIEndpoint, p.opts.Logger)
	if ep := p.opts.ContainerdEndpoint; ep != "" && ep != p.opts.CRIEndpoint {
		if p.containerd, err = cri.NewClient(ep, p.opts.CRI); err != nil {
			return fmt.Errorf("containerd endpoint: %w", err)
		}
	}
	return nil
}

// taskEvents returns where the generator subscribes to containerd's task
// events: the client of containerd's own endpoint, or else the CRI client.
func (p *pipeline) taskEvents() generator.TaskEventSource {
	if p.containerd != nil {
		return p.containerd
	}
	return p.cri
}

// connect connects to NATS, at Options.NATS.URL or else to an embedded
// server it starts, and makes the JetStream handle of the stream setup, the
// readiness probe and the state bucket; the publisher makes its own, with
// its ack handlers.
func (p *pipeline) connect() (err error) {
	url := p.opts.NATS.URL
	if url == "" {
		if p.ns, err = startEmbedded(p.opts.NATS.EmbeddedListen, p.opts.DataDir, p.opts.Logger); err != nil {
			return err
		}
		url = p.ns.ClientURL()
	}
	connected := newNATSConnectedGauge()
	if err := p.reg.Register(connected); err != nil {
		return fmt.Errorf("register NATS metrics: %w", err)
	}
	if p.nc, err = connectNATS(url, "pleg-bridge "+p.opts.Node, p.opts.NATS, p.refused, connected, p.opts.Logger); err != nil {
		return err
	}
	if p.js, err = jetstream.New(p.nc); err != nil {
		return fmt.Errorf("create JetStream context: %w", err)
	}
	return nil
}

// newEncoder makes the CloudEvents encoder the publisher and the state
// bucket's writer share.
func newEncoder(opts Options) (*publish.Encoder, error) {
	enc, err := publish.NewEncoder(publish.EncoderOptions{
		Node: opts.Node, ClusterName: opts.ClusterName, SubjectPrefix: opts.SubjectPrefix, Mode: opts.CEMode,
	})
	if err != nil {
		return nil, fmt.Errorf("configure CloudEvents: %w", err)
	}
	return enc, nil
}

// publisherSlot stands for the publisher in the parts built before it: the
// generator sends to it, and the state bucket's writer asks it what is
// pending. build sets it once, after publish.New and before anything runs;
// it does not change after, so it is safe for concurrent use. Send and
// Pending before set panic: nothing calls them before Run.
type publisherSlot struct{ pub *publish.Publisher }

var _ generator.Sink = (*publisherSlot)(nil)

func (s *publisherSlot) set(pub *publish.Publisher) { s.pub = pub }

func (s *publisherSlot) Send(ctx context.Context, events []generator.Event) error {
	return s.pub.Send(ctx, events)
}

func (s *publisherSlot) Pending() int { return s.pub.Pending() }

// buildGenerator builds the generator over the runtime client, sending to
// sink (the publisher) through the caller's hooks, and gives it the state it
// starts from: what was acked before the restart is not reported again, and
// what waited in the spool is not reported a second time (the spool
// delivers it).
func (p *pipeline) buildGenerator(sink generator.Sink) error {
	metrics, err := generator.NewMetrics(p.reg)
	if err != nil {
		return err
	}
	var rt generator.Runtime = generator.InstrumentRuntime(p.cri, metrics)
	if p.opts.Hooks.WrapRuntime != nil {
		rt = p.opts.Hooks.WrapRuntime(rt)
	}
	if p.opts.Hooks.WrapSink != nil {
		sink = p.opts.Hooks.WrapSink(sink)
	}
	// Taken before the generator exists: every observation it makes is
	// newer.
	sink = observedSink{Sink: sink, started: time.Now()}
	p.gen = generator.New(rt, sink, generator.Options{
		Mode:                p.opts.Mode,
		RelistPeriod:        p.opts.RelistPeriod,
		RelistThreshold:     p.opts.RelistThreshold,
		EventedRelistPeriod: p.opts.EventedRelistPeriod,
		ExitsFromCRI:        p.opts.ExitsFromCRI,
		PodAnnotations:      p.opts.PodAnnotations,
		TaskEvents:          generator.InstrumentTaskEvents(p.taskEvents(), metrics),
		// Beside rt, not found on it: Hooks.WrapRuntime's wrapper would
		// hide them, and the unchanged relist with them.
		Listings: p.cri,
		Logger:   p.opts.Logger,
		Metrics:  metrics,
	})
	// Before Run: the state the generator starts from.
	var published []generator.Event
	if p.store != nil {
		published = p.store.Checkpoint().Restored()
	}
	if spool := p.spool(); spool != nil {
		published = slices.Concat(published, spool.Restored())
	}
	p.gen.Restore(published)
	return nil
}

// buildStateWriter builds the state bucket's writer, with
// Options.StateBucket. It is written after the checkpoint with each ack,
// from the same events; it starts from what the checkpoint holds, and
// reconciles the node's keys once the first relist is acked: the generator
// is synced and pub has nothing pending.
func (p *pipeline) buildStateWriter(enc *publish.Encoder, pub *publisherSlot) (err error) {
	if p.opts.StateBucket == "" {
		return nil
	}
	var seed []generator.Event
	if p.store != nil {
		seed = p.store.Checkpoint().Restored()
	}
	gen := p.gen
	p.state, err = statebucket.New(p.js, statebucket.Options{
		Bucket: p.opts.StateBucket, Encoder: enc, Manage: p.opts.Stream.Manage, Replicas: p.opts.Stream.Replicas,
		Seed: seed, Ready: func() bool { return gen.Synced() && pub.Pending() == 0 },
		DrainTimeout: p.opts.ShutdownTimeout, Version: p.opts.Version, Registerer: p.reg, Logger: p.opts.Logger,
	})
	return err
}

// restart returns what the publisher of a restart starts from, from the
// durable store and the generator. Without a store only OnStored is set.
//
// The checkpoint records each ack with the publisher's watermark, and the
// publisher of a restart reads back what this node stored after the
// watermark written last: the acks a crash lost do not make it publish
// those events again, however long the bridge was down. What it reads
// back completes the generator's restored state: a container whose
// ContainerStarted was stored just before a crash and which went away
// meanwhile gets its Died and Removed. The checkpoint keeps no labels:
// what it carries into a new stream takes them from the generator.
func (p *pipeline) restart() publish.Restart {
	r := publish.Restart{OnStored: p.gen.Restore}
	if p.store == nil {
		return r
	}
	r.Checkpoint, r.PodMeta = p.store.Checkpoint(), p.gen.PodMeta
	if seq := r.Checkpoint.Sequence(); seq > 0 {
		r.From = seq + 1
	} else if created := r.Checkpoint.Created(); !created.IsZero() {
		// Killed before its first checkpoint write, a bridge stored
		// events that nothing here knows of: read back what this node
		// stored since the store was made.
		r.Since = created.Add(-reconcileClockMargin)
	}
	return r
}

// repair returns the repair's options: the acked events the store keeps
// (none without a store), and the state bucket reading its keys again
// after a repair, which the same loss may have rolled back.
func (p *pipeline) repair(h ackHooks) publish.Repair {
	r := publish.Repair{OnRepaired: h.onRepair}
	if p.store != nil {
		r.Retained = p.store.Retained()
	}
	return r
}

// ackHooks are what the publisher calls once JetStream acked; nil fields
// call nothing.
type ackHooks struct {
	onAck    func(ev generator.Event, seq uint64)
	onRepair func(lost int)
}

// acked returns the hooks that send each ack, in order, to the checkpoint
// first (what a restart relies on), then the caller's hook, then the state
// bucket; and, after a repair published again what the servers lost, make
// the state bucket read its keys again, which the same loss may have rolled
// back.
func (p *pipeline) acked() ackHooks {
	var acks []func(generator.Event, uint64)
	if p.store != nil {
		acks = append(acks, p.store.Checkpoint().RecordAck)
	}
	if hook := p.opts.Hooks.OnAck; hook != nil {
		acks = append(acks, func(ev generator.Event, _ uint64) { hook(ev) })
	}
	var h ackHooks
	if state := p.state; state != nil {
		acks = append(acks, func(ev generator.Event, _ uint64) { state.Record(ev) })
		h.onRepair = func(int) { state.Resync() }
	}
	if len(acks) > 0 {
		h.onAck = func(ev generator.Event, seq uint64) {
			for _, ack := range acks {
				ack(ev, seq)
			}
		}
	}
	return h
}

// publisherOptions is the publisher's configuration, from the options and
// what the steps before it made. It builds the literal and nothing else.
func (p *pipeline) publisherOptions(enc *publish.Encoder, spool *datadir.Spool, r publish.Restart, h ackHooks) publish.Options {
	return publish.Options{
		Encoder:     enc,
		MaxInFlight: p.opts.PublishMaxInFlight,
		OutboxSize:  p.opts.OutboxSize,
		Spool:       spool,
		// What waits in memory for NATS outlives a killed process too.
		WriteThrough:    spool != nil,
		Stream:          p.opts.Stream.Name,
		DuplicateWindow: p.opts.Stream.DuplicateWindow,
		DrainTimeout:    p.opts.ShutdownTimeout,
		Registerer:      p.reg,
		Logger:          p.opts.Logger,
		OnAck:           h.onAck,
		Restart:         r,
		Repair:          p.repair(h),
	}
}

// warnMissingSocket logs at Warn, once, that the CRI socket of endpoint
// does not exist. That is no reason to fail: on a node the bridge may start
// before the runtime, and a DaemonSet's pod that exits would only be
// restarted with a backoff. The relists retry every period; the first that
// works is logged as the relist recovered.
func warnMissingSocket(endpoint string, log *slog.Logger) {
	path, err := cri.ParseEndpoint(endpoint)
	if err != nil {
		return
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		log.Warn("the CRI socket does not exist (yet); relisting keeps retrying until the runtime creates it",
			"path", path, "err", err)
	}
}

// run runs the components and the HTTP endpoint on lis (if not nil) until
// ctx is done or one of them fails, and stops them in the shutdown order.
func (p *pipeline) run(ctx context.Context, lis net.Listener) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var srv *http.Server
	served := make(chan error, 1)
	if lis != nil {
		srv = &http.Server{Handler: p.handler(), ReadHeaderTimeout: httpReadHeaderTimeout}
		addr := lis.Addr().String()
		p.opts.Logger.Info("serving metrics and health", "address", addr)
		go func() { // joined below, after srv.Shutdown
			err := srv.Serve(lis)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			} else {
				err = fmt.Errorf("serve metrics and health on %s: %w", addr, err)
				cancel(err)
			}
			served <- err
		}()
	}

	err := p.runComponents(ctx)
	p.closeNATS()
	if srv != nil {
		sctx, stop := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
		defer stop()
		if err := srv.Shutdown(sctx); err != nil {
			p.opts.Logger.Warn("stop serving metrics and health, closing the connections left", "err", err)
			srv.Close()
		}
		if serr := <-served; err == nil {
			err = serr
		}
	}
	return err
}

// runComponents runs the generator, the publisher, the durable store's
// writer and the stream setup until ctx is done or one of them fails. Each
// later stage has a context of its own that the stage before it cancels when
// it is done, which gives the shutdown order.
func (p *pipeline) runComponents(ctx context.Context) error {
	pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPub()
	storeCtx, stopStore := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStore()
	eg, gctx := errgroup.WithContext(ctx)
	eg.Go(func() error {
		p.endStartup(gctx)
		return nil
	})
	if p.opts.Stream.Manage {
		eg.Go(func() error {
			if err := ensureStream(gctx, p.js, p.opts, p.refused.advice); err != nil && gctx.Err() == nil {
				return fmt.Errorf("set up stream %s: %w", p.opts.Stream.Name, err)
			}
			return nil
		})
	}
	eg.Go(func() error {
		defer stopPub() // no more events: deliver what is pending
		if err := p.gen.Run(gctx); err != nil {
			return fmt.Errorf("generator: %w", err)
		}
		return nil
	})
	eg.Go(func() error {
		defer stopStore() // every ack is in: write the durable state a last time
		if err := p.pub.Run(pubCtx); err != nil {
			return fmt.Errorf("publisher: %w", err)
		}
		return nil
	})
	if p.store != nil {
		eg.Go(func() error { return p.store.Run(storeCtx) })
	}
	if p.state != nil {
		// Stopped with the store, once every ack is in: it writes what is
		// dirty a last time before NATS is closed. It returns nil: the
		// stream does not depend on the bucket.
		eg.Go(func() error { return p.state.Run(storeCtx) })
	}
	return eg.Wait()
}

// closeNATS closes the connection and stops the embedded server. It may be
// called more than once.
func (p *pipeline) closeNATS() {
	if p.nc != nil {
		p.nc.Close()
	}
	if p.ns != nil {
		p.ns.Shutdown()
		p.ns.WaitForShutdown()
	}
}

// close releases everything build opened, in reverse order.
func (p *pipeline) close() {
	p.closeNATS()
	if p.cri != nil {
		p.cri.Close()
	}
	if p.containerd != nil {
		p.containerd.Close()
	}
	if p.store != nil {
		if err := p.store.Close(); err != nil {
			p.opts.Logger.Warn("close the durable store", "err", err)
		}
	}
}

// registerListedItems registers pleg_bridge_listed_items_total, which
// shows whether the steady relists reuse what the last one decoded (see
// cri.Client.ReuseListings): from the end of the start-up on, "reused"
// should grow by about the node's containers and sandboxes each full
// relist, and "decoded" by what changed.
func registerListedItems(reg prometheus.Registerer, client *cri.Client) error {
	for _, how := range []string{"decoded", "reused"} {
		c := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "pleg_bridge_listed_items_total",
			Help:        "Containers and sandboxes the CRI listings returned, by how they were read: decoded, or reused unchanged from the last full listing.",
			ConstLabels: prometheus.Labels{"how": how},
		}, func() float64 {
			decoded, reused := client.ListedItems()
			if how == "decoded" {
				return float64(decoded)
			}
			return float64(reused)
		})
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register listing metrics: %w", err)
		}
	}
	return nil
}
