package metricstest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
)

func TestValueFindsTheSeriesWithTheLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "things_total", Help: "h"}, []string{"kind"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "level", Help: "h"})
	reg.MustRegister(c, g)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(5)
	g.Set(7)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"things_total", map[string]string{"kind": "a"}, 2},
		{"things_total", map[string]string{"kind": "b"}, 5},
		{"level", nil, 7},
	} {
		if got := metricstest.Value(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("Value(%s%v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
