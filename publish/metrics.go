package publish

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/datadir"
)

// Results of a publish attempt or of a check against the stream, the
// values of the result label.
const (
	resultAcked     = "acked"
	resultDuplicate = "duplicate"
	resultError     = "error"
	resultStored    = "stored"
	resultMissing   = "missing"
	// resultReconciled: found by the read of what an earlier run stored
	// (readback.go), not by a check.
	resultReconciled = "reconciled"
)

// metrics are the Publisher's collectors. They exist, unregistered, when no
// Registerer is given, so the code that updates them has no nil checks.
type metrics struct {
	published   *prometheus.CounterVec
	acked       prometheus.Counter
	duplicate   prometheus.Counter
	failed      prometheus.Counter
	ackDuration prometheus.Histogram
	dropped     prometheus.Counter
	outbox      prometheus.GaugeFunc
	outboxCap   prometheus.Gauge
	inFlight    prometheus.Gauge

	spooled      prometheus.Counter
	refused      prometheus.Counter
	spoolEvents  prometheus.GaugeFunc
	spoolBytes   prometheus.GaugeFunc
	spoolCap     prometheus.Gauge
	checks       *prometheus.CounterVec
	checkStored  prometheus.Counter
	checkMissing prometheus.Counter
	checkError   prometheus.Counter
	// checkReconciled counts the events found stored by the read of what
	// an earlier run stored.
	checkReconciled prometheus.Counter
	// readBack and readBackUndecoded count the messages the read of what an
	// earlier run stored after its checkpoint found, by whether their
	// event was decoded (and so given to the checkpoint and the
	// generator).
	readBackMessages  *prometheus.CounterVec
	readBack          prometheus.Counter
	readBackUndecoded prometheus.Counter
	// repairChecks counts the checks that the stream still holds the acked
	// events kept (repair.go) by result; republished the events they
	// found lost and published again.
	repairChecks *prometheus.CounterVec
	republishedV *prometheus.CounterVec
	republished  prometheus.Counter
	keptEvents   prometheus.GaugeFunc
	keptBytes    prometheus.GaugeFunc
}

// newMetrics creates the collectors and registers them on reg. pending
// reports the memory outbox's fill and outboxSize its bound; spool (nil:
// none) reports its own. The bounds are exported beside the fills so that
// an alert can say "80% full" without knowing the configuration.
func newMetrics(reg prometheus.Registerer, pending func() int, outboxSize int, spool *datadir.Spool, kept *datadir.Retained) (*metrics, error) {
	keptLen := func() (int, int64) {
		if kept == nil {
			return 0, 0
		}
		return kept.Len()
	}
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_publish_total",
			Help: "Publish attempts to JetStream by result: acked, duplicate (acked, already stored), error (failed, will be retried).",
		}, []string{"result"}),
		ackDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "pleg_bridge_publish_ack_duration_seconds",
			Help: "Time from publishing an event to its JetStream ack, of the attempt that was acked.",
			// 250µs to about 8s: a local server acks in well under a
			// millisecond, a stream replicated across zones in tens of ms.
			Buckets: prometheus.ExponentialBuckets(0.00025, 2, 16),
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_events_dropped_total",
			Help: "Lifecycle events given up without delivery: not encodable, or still undelivered when the drain timeout ended.",
		}),
		outbox: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pleg_bridge_outbox_events",
			Help: "Lifecycle events accepted by the publisher and not yet acked: queued plus in flight.",
		}, func() float64 { return float64(pending()) }),
		outboxCap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_outbox_capacity_events",
			Help: "The memory outbox's bound (PLEG_OUTBOX_SIZE): beyond it events go to the disk spool, or are refused.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_publish_in_flight",
			Help: "Messages published to JetStream and waiting for their ack.",
		}),
		spooled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_events_spooled_total",
			Help: "Lifecycle events written to the disk spool because the memory outbox was full.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_bridge_events_refused_total",
			Help: "Lifecycle events the publisher refused for want of room in the outbox and the spool; the generator keeps them and sends them again.",
		}),
		spoolEvents: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pleg_bridge_spool_events",
			Help: "Lifecycle events in the disk spool, not yet delivered.",
		}, func() float64 {
			if spool == nil {
				return 0
			}
			return float64(spool.Len())
		}),
		spoolBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pleg_bridge_spool_bytes",
			Help: "Encoded size of the events in the disk spool, which the spool's size limit bounds.",
		}, func() float64 {
			if spool == nil {
				return 0
			}
			return float64(spool.Bytes())
		}),
		spoolCap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_spool_capacity_bytes",
			Help: "The disk spool's bound on pleg_bridge_spool_bytes (PLEG_SPOOL_MAX_BYTES); 0 without a spool.",
		}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_publish_checks_total",
			Help: "Checks against the stream of an event that may be stored already (a retry near the end of the duplicate window, an event an earlier run may have stored), by result: stored (delivered, not published again), missing (published), error (retried), reconciled (found among the messages an earlier run stored after its checkpoint, read at start: delivered, not published again).",
		}, []string{"result"}),
		readBackMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_read_back_messages_total",
			Help: "Messages this node stored after the checkpoint, read back at start, by result: decoded (taken in as published by the checkpoint and the generator, so that a container gone meanwhile gets the rest of its events), undecoded (only recognised by id).",
		}, []string{"result"}),
		repairChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_repair_checks_total",
			Help: "Checks that the stream still holds the acknowledged events kept for PLEG_REPAIR_WINDOW (at start, after a reconnect, a leader election or a sequence going backwards), by result: intact, repaired (events found lost and published again), error (tried again), new_stream (the stream was created anew: left alone).",
		}, []string{"result"}),
		republishedV: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_bridge_events_republished_total",
			Help: "Lifecycle events published again by the repair, by reason: lost_by_server (JetStream had acknowledged them and no longer held them: a power loss, an OS crash or a corrupt replica of the NATS servers).",
		}, []string{"reason"}),
		keptEvents: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pleg_bridge_repair_kept_events",
			Help: "Acknowledged events kept under PLEG_DATA_DIR for the repair (PLEG_REPAIR_WINDOW).",
		}, func() float64 { n, _ := keptLen(); return float64(n) }),
		keptBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pleg_bridge_repair_kept_bytes",
			Help: "Bytes of the acknowledged events kept for the repair, which PLEG_REPAIR_MAX_BYTES bounds.",
		}, func() float64 { _, b := keptLen(); return float64(b) }),
	}
	m.outboxCap.Set(float64(outboxSize))
	if spool != nil {
		m.spoolCap.Set(float64(spool.MaxBytes()))
	}
	m.acked = m.published.WithLabelValues(resultAcked)
	m.duplicate = m.published.WithLabelValues(resultDuplicate)
	m.failed = m.published.WithLabelValues(resultError)
	m.checkStored = m.checks.WithLabelValues(resultStored)
	m.checkMissing = m.checks.WithLabelValues(resultMissing)
	m.checkError = m.checks.WithLabelValues(resultError)
	m.checkReconciled = m.checks.WithLabelValues(resultReconciled)
	m.readBack = m.readBackMessages.WithLabelValues("decoded")
	m.readBackUndecoded = m.readBackMessages.WithLabelValues("undecoded")
	m.republished = m.republishedV.WithLabelValues("lost_by_server")
	for _, r := range []string{repairIntact, repairRepaired, repairError, repairNewStream} {
		m.repairChecks.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.ackDuration, m.dropped, m.outbox, m.outboxCap, m.inFlight,
		m.spooled, m.refused, m.spoolEvents, m.spoolBytes, m.spoolCap, m.checks, m.readBackMessages,
		m.repairChecks, m.republishedV, m.keptEvents, m.keptBytes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register publisher metrics: %w", err)
		}
	}
	return m, nil
}
