package statebucket

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the result label of pleg_bridge_state_writes_total: the
// Publisher's own (pleg_bridge_publish_total).
const (
	resultOK    = "ok"
	resultError = "error"
)

// metrics are the Writer's collectors.
type metrics struct {
	writes     *prometheus.CounterVec
	reconciles prometheus.Counter
	forgotten  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, pending func() int) (*metrics, error) {
	m := &metrics{
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
