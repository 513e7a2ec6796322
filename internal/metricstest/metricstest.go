// Package metricstest reads metrics back from a Prometheus registry in
// tests: one helper for the packages that check what they count.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Value returns the value of the counter or gauge name, in the first series
// whose labels include labels (nil: the first series), as g exposes it. It
// fails the test if there is none.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := Find(t, g, name, labels)
	if !ok {
		t.Fatalf("no metric %s%v", name, labels)
	}
	return v
}

// Find is Value for a series that may not exist yet (a metric registered
// as the code under test builds it): ok is false while there is none.
func Find(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (v float64, ok bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}
