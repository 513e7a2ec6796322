package soak

import (
	"strings"
	"testing"
)

func TestSumSamples(t *testing.T) {
	const exposition = `# HELP pleg_bridge_events_dropped_total Events given up.
# TYPE pleg_bridge_events_dropped_total counter
pleg_bridge_events_dropped_total{reason="spool_full"} 3
pleg_bridge_events_dropped_total{reason="a } in a label"} 2
pleg_bridge_events_dropped_total_extra 100
pleg_bridge_events_dropped 50
pleg_bridge_publish_total{result="ok"} 7
`
	tests := []struct {
		name string
		text string
		want float64
	}{
		{"the samples of every label set are summed, and only those of the metric named", exposition, 5},
		{"a metric the bridge does not expose yet counts 0", "pleg_bridge_publish_total 1\n", 0},
		{"a metric without labels is read", "pleg_bridge_events_dropped_total 4 1700000000000\n", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sumSamples(strings.NewReader(tt.text), "pleg_bridge_events_dropped_total")
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("sum = %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := sumSamples(strings.NewReader("pleg_bridge_events_dropped_total x\n"), "pleg_bridge_events_dropped_total"); err == nil {
		t.Error("a sample that is not a number: no error")
	}
}
