package soak

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// This file is the soak's side of Options.Prometheus: it starts Prometheus
// and Alertmanager, holds each fault until the alerts it must fire fired,
// waits for them to resolve after the repair, and at the end judges the
// alerts and runs the dashboard's queries.

// soakSpoolBytes is the bridge's PLEG_SPOOL_MAX_BYTES with Prometheus:
// at 200 events a second a NATS outage fills half of it in a few seconds
// (PlegBridgeSpoolFilling) and all of it soon after
// (PlegBridgeEventsHeldBack).
const soakSpoolBytes = 1 << 20

// AlertingOutboxSize is the bridge's outbox with Prometheus unless
// Options.OutboxSize says otherwise: big enough that a few seconds of
// slow acks on a busy machine do not fill 80% of it for PlegBridgeOutbox
// Filling's 10 s (5 minutes scaled), small enough that a NATS outage
// fills it in 3 s.
const AlertingOutboxSize = 512

// alertPoll is how often a fault held for its alerts looks at what fired.
const alertPoll = 20 * time.Millisecond

// startAlerting starts the alert webhook, Alertmanager and Prometheus,
// and waits until Prometheus has scraped the bridge at listen.
func (s *soak) startAlerting(ctx context.Context, listen string) error {
	o := s.opts
	var err error
	if s.alerts, err = newAlertReceiver(); err != nil {
		return err
	}
	alertCtx, stop := context.WithCancel(ctx)
	s.stopAlerts = stop
	s.group.Go(func() error { return s.alerts.Run(alertCtx) })
	if s.prom, err = startPromStack(ctx, filepath.Join(o.Dir, "prometheus"), o.PrometheusBinary, o.AlertmanagerBinary, o.renderedRules, listen, s.alerts.url()); err != nil {
		return err
	}
	s.prog.Printf("Prometheus %s (rules %s, every time divided by %d, scrape every %v), Alertmanager %s, alert webhook %s",
		s.prom.promURL, o.RulesFile, AlertTimeScale, scrapeInterval, s.prom.amURL, s.alerts.url())
	deadline := time.Now().Add(promStartTimeout)
	ticker := time.NewTicker(scrapeInterval / 4)
	defer ticker.Stop()
	for {
		series, err := s.prom.query(ctx, `up{job="pleg-bridge"} == 1`, time.Time{}, time.Time{}, 0)
		if err == nil && len(series) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prometheus has not scraped the bridge after %v (err %v; log %s)", promStartTimeout, err, filepath.Join(s.prom.dir, "prometheus.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}

// holdAlerts keeps a fault that began at began going until minEnd, and
// with Prometheus until every alert the fault must fire has fired since
// began, or the last of their deadlines passed. tick, if not nil, is
// called every alertPoll meanwhile. It says what fired, for the progress
// line, and returns early with an error as waitUntil does.
func (s *soak) holdAlerts(ctx context.Context, fault string, began, minEnd time.Time, tick func()) (string, error) {
	want := s.opts.alertsOf(fault)
	if len(want) == 0 {
		return "", s.runner.Until(ctx, minEnd)
	}
	deadline := minEnd
	for _, r := range want {
		deadline = later(deadline, began.Add(alertExpectations[r.Alert].deadline(r)))
	}
	firedAll := func(eps map[string][]Episode) bool {
		for _, r := range want {
			if firedSince(eps[r.Alert], began).IsZero() {
				return false
			}
		}
		return true
	}
	ticker := time.NewTicker(alertPoll)
	defer ticker.Stop()
	for {
		now := time.Now()
		if !now.Before(minEnd) {
			if !s.opts.Prometheus {
				return "", nil
			}
			eps, _ := s.alerts.snapshot()
			if firedAll(eps) || !now.Before(deadline) {
				return "; " + firedNote(want, eps, began), nil
			}
		}
		if err := s.runner.Until(ctx, now.Add(alertPoll)); err != nil {
			return "", err
		}
		if tick != nil {
			tick()
		}
	}
}

// firedSince returns when the first episode that began at or after t
// fired, zero if none did.
func firedSince(eps []Episode, t time.Time) time.Time {
	for _, ep := range eps {
		if !ep.Fired.Before(t) {
			return ep.Fired
		}
	}
	return time.Time{}
}

// firedNote says which alerts fired how long after began, and which did
// not.
func firedNote(want []rule, eps map[string][]Episode, began time.Time) string {
	var parts []string
	for _, r := range want {
		if at := firedSince(eps[r.Alert], began); !at.IsZero() {
			parts = append(parts, fmt.Sprintf("%s fired after %v", r.Alert, roundDelay(at.Sub(began))))
		} else {
			parts = append(parts, r.Alert+" did NOT fire")
		}
	}
	return strings.Join(parts, ", ")
}

// awaitResolved waits, with Prometheus, after a fault's repair until no
// alert fires, for as long as the fault's alerts may take to resolve. It
// says how long that took, for the progress line.
func (s *soak) awaitResolved(ctx context.Context, fault string) string {
	if !s.opts.Prometheus {
		return ""
	}
	within := resolveSlack
	for _, r := range s.opts.alertsOf(fault) {
		within = max(within, alertExpectations[r.Alert].resolveWithin())
	}
	repaired := time.Now()
	quiet := s.alerts.waitFor(ctx, repaired.Add(within), func(eps map[string][]Episode) bool {
		return len(firing(eps)) == 0
	})
	if !quiet {
		eps, _ := s.alerts.snapshot()
		return fmt.Sprintf("; still firing %v after: %s", within, strings.Join(firing(eps), ", "))
	}
	return fmt.Sprintf("; no alert firing %v after", roundDelay(time.Since(repaired)))
}

// firing returns the alerts firing now, sorted.
func firing(eps map[string][]Episode) []string {
	var out []string
	for name, e := range eps {
		if len(e) > 0 && e[len(e)-1].Resolved.IsZero() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// checkAlerting runs the dashboard's queries over the run, which ended at
// end, and judges the alerts against the faults' windows.
func (s *soak) checkAlerting(ctx context.Context, end time.Time) ([]AlertResult, []PanelResult) {
	panels := s.prom.checkDashboard(ctx, s.opts.dashboard, s.runner.Start(), end)
	empty := 0
	for _, p := range panels {
		if p.Err != "" || p.Series == 0 {
			empty++
		}
	}
	s.prog.Printf("dashboard: %d queries, %d with no data", len(panels), empty)
	eps, _ := s.alerts.snapshot()
	return judgeAlerts(s.opts.rules, s.runner.Windows(), s.faults, eps), panels
}
