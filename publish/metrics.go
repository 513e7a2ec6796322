package publish

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a publish attempt, the values of the result label.
const (
	resultAcked     = "acked"
	resultDuplicate = "duplicate"
	resultError     = "error"
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
	inFlight    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, pending func() int) (*metrics, error) {
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
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_bridge_publish_in_flight",
			Help: "Messages published to JetStream and waiting for their ack.",
		}),
	}
	m.acked = m.published.WithLabelValues(resultAcked)
	m.duplicate = m.published.WithLabelValues(resultDuplicate)
	m.failed = m.published.WithLabelValues(resultError)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.ackDuration, m.dropped, m.outbox, m.inFlight} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register publisher metrics: %w", err)
		}
	}
	return m, nil
}
