package generator_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

func TestUnreportedEventsAreExportedAtZeroBeforeTheFirstLoss(t *testing.T) {
	t.Parallel()
	// The alert on lost events takes increase() of this counter, which
	// cannot see the first increment of a series that appears at 1.
	reg := prometheus.NewRegistry()
	if _, err := generator.NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	const want = `
# HELP pleg_bridge_events_unreported_total Lifecycle events never sent: the sink was full until their container's record expired.
# TYPE pleg_bridge_events_unreported_total counter
pleg_bridge_events_unreported_total{event_type="ContainerDied"} 0
pleg_bridge_events_unreported_total{event_type="ContainerRemoved"} 0
pleg_bridge_events_unreported_total{event_type="ContainerStarted"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pleg_bridge_events_unreported_total"); err != nil {
		t.Error(err)
	}
}
