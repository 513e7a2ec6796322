package soak

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// healthPoll is how often the monitor asks /healthz: often enough to catch
// a failure of a fraction of a second, rare enough to cost the bridge
// nothing.
const healthPoll = 100 * time.Millisecond

// healthMonitor asks the bridge's /healthz every healthPoll while the
// bridge is meant to be up, and records every answer other than 200. The
// contract says /healthz depends on relisting only: it must stay 200
// through NATS faults, stream drops and short runtime restarts.
//
// setUp and failures are safe for concurrent use with Run.
type healthMonitor struct {
	bridge *bridgeProcess

	// probeMu is held during a probe, so that setUp(false) returns only
	// once no probe of a bridge about to be killed is in flight.
	probeMu sync.Mutex
	up      bool // guarded by probeMu

	mu     sync.Mutex
	failed []HealthFailure // guarded by mu
}

// setUp says whether the bridge is meant to be up. Before the soak kills or
// stops the bridge, it calls setUp(false), which waits for a probe in
// flight; after the bridge is ready again, setUp(true).
func (m *healthMonitor) setUp(up bool) {
	m.probeMu.Lock()
	defer m.probeMu.Unlock()
	m.up = up
}

func (m *healthMonitor) failures() []HealthFailure {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.failed)
}

// Run probes until ctx is done, then returns nil.
func (m *healthMonitor) Run(ctx context.Context) error {
	ticker := time.NewTicker(healthPoll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		m.probe(ctx)
	}
}

func (m *healthMonitor) probe(ctx context.Context) {
	m.probeMu.Lock()
	defer m.probeMu.Unlock()
	if !m.up {
		return
	}
	at := time.Now()
	status, body, err := m.bridge.get(ctx, "/healthz")
	if ctx.Err() != nil {
		return
	}
	var detail string
	switch {
	case err != nil:
		detail = err.Error()
	case status != http.StatusOK:
		detail = fmt.Sprintf("%d %s", status, body)
	default:
		return
	}
	m.mu.Lock()
	m.failed = append(m.failed, HealthFailure{At: at, Detail: detail})
	m.mu.Unlock()
}
