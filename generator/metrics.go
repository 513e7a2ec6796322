package generator

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Metrics are the generator's Prometheus metrics. The zero value is not
// usable; build it with NewMetrics.
type Metrics struct {
	relistDuration   prometheus.Histogram
	relistInterval   prometheus.Histogram
	lastRelist       prometheus.Gauge
	relists          *prometheus.CounterVec
	relistsUnchanged prometheus.Counter
	events           *prometheus.CounterVec
	skipped          *prometheus.CounterVec
	criRequests      *prometheus.CounterVec
	criDuration      *prometheus.HistogramVec
	streamReconnects prometheus.Counter
	streamEvents     *prometheus.CounterVec
	missedByStream   prometheus.Counter
	mode             *prometheus.GaugeVec
	suppressed       *prometheus.CounterVec
	streamConnected  prometheus.Gauge
	targetedPending  prometheus.Gauge
	unsent           prometheus.Gauge
	unreported       *prometheus.CounterVec

	// containerd's event service, as a trigger.
	taskReconnects prometheus.Counter
	taskEvents     *prometheus.CounterVec
	taskConnected  prometheus.Gauge
	triggers       *prometheus.CounterVec
	eventSource    *prometheus.GaugeVec
	// taskMismatches counts, by field, where CRI's later view of an exit
	// differed from what containerd's task exit said (exits.go).
	taskMismatches *prometheus.CounterVec
}

// sourceMetrics are the metrics of one event source's connection.
type sourceMetrics struct {
	connected  prometheus.Gauge
	reconnects prometheus.Counter
	events     *prometheus.CounterVec
}

// sourceMetrics returns the connection metrics of src.
func (m *Metrics) sourceMetrics(src eventSource) sourceMetrics {
	if src == sourceContainerd {
		return sourceMetrics{connected: m.taskConnected, reconnects: m.taskReconnects, events: m.taskEvents}
	}
	return sourceMetrics{connected: m.streamConnected, reconnects: m.streamReconnects, events: m.streamEvents}
}

// NewMetrics creates the generator's metrics and registers them on reg
// (nil: not registered, for tests that do not look at them). It returns
// the error of a registration that failed (a name registered twice).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.relistDuration, m.relistInterval, m.lastRelist, m.relists, m.relistsUnchanged, m.events,
		m.skipped, m.criRequests, m.criDuration, m.streamReconnects, m.streamEvents,
		m.missedByStream, m.mode, m.suppressed, m.streamConnected, m.targetedPending,
		m.unsent, m.unreported, m.taskReconnects, m.taskEvents, m.taskConnected, m.triggers, m.eventSource, m.taskMismatches} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register generator metrics: %w", err)
		}
	}
	return m, nil
}

// newMetrics creates the generator's metrics, registered nowhere.
func newMetrics() *Metrics {
	m := &Metrics{
		relistDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pleg_bridge_relist_duration_seconds",
			Help:    "Duration of a relist: listing, status calls and merge.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		relistInterval: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pleg_bridge_relist_interval_seconds",
			Help:    "Time between the starts of two consecutive relists.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}),
		lastRelist: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_last_relist_timestamp_seconds",
			Help: "Unix time of the start of the last successful relist (the kubelet's PLEG last seen).",
		}),
		relists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_relists_total",
			Help: "Relists by kind (full, targeted) and result (ok, error).",
		}, []string{"kind", "result"}),
		relistsUnchanged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_relists_unchanged_total",
			Help: "Full relists that listed exactly what the last merged one did, with nothing else merged since: nothing to merge, so nothing was (counted in pleg_bridge_relists_total too).",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_events_total",
			Help: "Lifecycle events generated, by type and by the source that detected them.",
		}, []string{"event_type", "source"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_runtime_objects_skipped_total",
			Help: "Malformed runtime objects skipped (no ID or no pod UID), by kind.",
		}, []string{"kind"}),
		criRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_cri_requests_total",
			Help: "CRI requests by operation and result (gRPC code).",
		}, []string{"operation", "result"}),
		criDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pleg_bridge_cri_request_duration_seconds",
			Help:    "Latency of unary CRI requests by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"operation"}),
		streamReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_cri_stream_reconnects_total",
			Help: "Times the GetContainerEvents stream was (re)opened after the first time.",
		}),
		streamEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_cri_stream_events_total",
			Help: "GetContainerEvents messages by result (accepted, dropped, invalid).",
		}, []string{"result"}),
		missedByStream: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_stream_missed_transitions_total",
			Help: "Transitions a relist found that the event stream should have reported first.",
		}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_cache_suppressed_total",
			Help: "Stream events reporting a transition the cache already held (duplicates, late or reordered), which produced no event.",
		}, []string{"source"}),
		streamConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_cri_stream_connected",
			Help: "1 while a GetContainerEvents stream is open, else 0.",
		}),
		targetedPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_targeted_relists_pending",
			Help: "Pods waiting for the targeted relist a STOPPED or DELETED event asked for.",
		}),
		unsent: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_events_unsent",
			Help: "Lifecycle events produced while the sink was full, kept in the generator's state for a backfill.",
		}),
		unreported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_events_unreported_total",
			Help: "Lifecycle events never sent: the sink was full until their container's record expired.",
		}, []string{"event_type"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pleg_bridge_mode",
			Help: "The generator's current mode (1 for the active one).",
		}, []string{"mode"}),
		taskReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_containerd_events_reconnects_total",
			Help: "Times the subscription to containerd's event service was (re)opened after the first time.",
		}),
		taskEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_containerd_events_total",
			Help: "containerd event service messages by result (accepted, dropped, invalid).",
		}, []string{"result"}),
		taskConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_containerd_events_connected",
			Help: "1 while a subscription to containerd's event service is open, else 0.",
		}),
		triggers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_containerd_triggers_total",
			Help: "What became of containerd's events as triggers: requested (a targeted relist), known (the cache held it), exec (an exec's exit), confirmed, relooked (not listed yet, asked again), listed (an ID not cached, left to a full relist with others), unconfirmed and unresolved (left to the periodic relist), died (a task exit of a container held running, reported at once), oom (an OOM kill, kept for the exit's reason).",
		}, []string{"result"}),
		eventSource: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pleg_bridge_event_source",
			Help: "Where the evented source takes events from (1 for the one chosen): cri (GetContainerEvents) or containerd (containerd's event service, as a trigger).",
		}, []string{"source"}),
		taskMismatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_task_event_mismatches_total",
			Help: "ContainerDied events taken from containerd's task exit whose exit_code, finished_at or reason CRI later reported otherwise, by field. The published event is not corrected; each difference is logged at Warn.",
		}, []string{"field"}),
	}
	for _, f := range []string{mismatchExitCode, mismatchFinishedAt, mismatchReason} {
		m.taskMismatches.WithLabelValues(f)
	}
	// A loss must show as an increase: a series born at 1 would hide the
	// first one from increase() and rate(), so every event type starts at 0.
	for _, t := range []LifecycleEventType{ContainerStarted, ContainerDied, ContainerRemoved} {
		m.unreported.WithLabelValues(string(t))
	}
	return m
}

// instrumented is the Runtime decorator that records CRI request metrics.
// A WatchEvents stream is counted once, when it ends, with the code it ended
// with; pleg_bridge_cri_stream_connected shows an open one.
type instrumented struct {
	rt Runtime
	m  *Metrics
}

// InstrumentRuntime wraps rt so that every call is counted in
// pleg_bridge_cri_requests_total and timed in
// pleg_bridge_cri_request_duration_seconds. Errors pass through unchanged.
func InstrumentRuntime(rt Runtime, m *Metrics) Runtime {
	return &instrumented{rt: rt, m: m}
}

func (i *instrumented) observe(op string, start time.Time, err error) {
	if op != "GetContainerEvents" {
		i.m.criDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	}
	i.m.criRequests.WithLabelValues(op, status.Code(err).String()).Inc()
}

func (i *instrumented) Version(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	start := time.Now()
	v, err := i.rt.Version(ctx)
	i.observe("Version", start, err)
	return v, err
}

func (i *instrumented) ListPodSandbox(ctx context.Context, f *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	start := time.Now()
	v, err := i.rt.ListPodSandbox(ctx, f)
	i.observe("ListPodSandbox", start, err)
	return v, err
}

func (i *instrumented) ListContainers(ctx context.Context, f *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	start := time.Now()
	v, err := i.rt.ListContainers(ctx, f)
	i.observe("ListContainers", start, err)
	return v, err
}

func (i *instrumented) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	start := time.Now()
	v, err := i.rt.ContainerStatus(ctx, id)
	i.observe("ContainerStatus", start, err)
	return v, err
}

func (i *instrumented) WatchEvents(ctx context.Context, fn func(*runtimeapi.ContainerEventResponse)) error {
	start := time.Now()
	err := i.rt.WatchEvents(ctx, fn)
	i.observe("GetContainerEvents", start, err)
	return err
}

// instrumentedTasks is the TaskEventSource decorator that records a
// subscription in pleg_bridge_cri_requests_total (operation "Subscribe")
// when it ends, with the code it ended with.
type instrumentedTasks struct {
	src TaskEventSource
	m   *Metrics
}

// InstrumentTaskEvents wraps src like InstrumentRuntime wraps a Runtime;
// nil stays nil.
func InstrumentTaskEvents(src TaskEventSource, m *Metrics) TaskEventSource {
	if src == nil {
		return nil
	}
	return &instrumentedTasks{src: src, m: m}
}

func (i *instrumentedTasks) WatchTaskEvents(ctx context.Context, fn func(TaskEvent, error)) error {
	err := i.src.WatchTaskEvents(ctx, fn)
	i.m.criRequests.WithLabelValues("Subscribe", status.Code(err).String()).Inc()
	return err
}
