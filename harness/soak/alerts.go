package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"
)

// alertExpectation says which faults of the schedule must fire an alert,
// which may fire it too, and how long its condition takes to hold once
// such a fault began.
type alertExpectation struct {
	// Fires are the faults each of which must fire the alert, when the
	// schedule has it.
	Fires []string
	// MayFire are faults that may fire it too, as a side effect.
	MayFire []string
	// BuildUp is how long, in the soak's time, the alert's condition takes
	// to hold after the fault began: a rate over a range needs part of the
	// range, a threshold on an age needs that age. The alert must fire
	// within BuildUp, its for, two scrape intervals and notifySlack.
	BuildUp time.Duration
	// ResolveWithin is how long after the fault's repair the alert may
	// take to resolve (resolveSlack if 0).
	ResolveWithin time.Duration
	// NotExpected says why no fault fires the alert; its runbook says so
	// too.
	NotExpected string
}

// notifySlack is the time from an alert's condition holding for its for to
// the webhook's notification: the next rule evaluation and Alertmanager's
// delivery.
const notifySlack = 3 * scrapeInterval

// resolveSlack is how long an alert may take to resolve after its fault
// was repaired: the bridge back (a second or two), a scrape, the part of a
// rate's range of the soak's rules (10 s) that still holds errors, and the
// notification.
const resolveSlack = 10 * time.Second

// alertExpectations covers every alert of deploy/prometheus/rules.yml; a
// rules file with an alert missing here fails the soak, so that a new alert
// comes with the fault that fires it, or the reason none can.
var alertExpectations = map[string]alertExpectation{
	"PlegBridgePLEGNotHealthy": {
		Fires: []string{FaultRuntimeRestart},
		// While its event stream is down, the bridge holds each relist
		// back for up to 3 s for the replay of the next connection
		// (generator's replayHold, not scaled with the rules), half the
		// soak's threshold of 6 s.
		MayFire: []string{FaultStreamRefused, FaultStreamDrop},
		// The threshold: 180 s in production, 6 s in the soak.
		BuildUp: 180 * time.Second / AlertTimeScale,
	},
	"PlegBridgeRelistSlow": {
		NotExpected: "needs relists that take a minute (2 s in the soak) on average over 15 minutes, while the bridge stays healthy; the simulated runtime answers in milliseconds and no fault slows its listing",
	},
	"PlegBridgeEventsLost": {
		NotExpected: "fires when the bridge gives up an event; every fault of the soak must lose none, and a loss fails the soak's accounting anyway",
	},
	"PlegBridgeAckedEventsLostByServer": {
		NotExpected: "fires when the servers lose what they acknowledged, which only the machine faults (power-loss, os-crash, corrupt-replica) make them do, and those run without --prometheus",
	},
	"PlegBridgePublishFailing": {
		Fires:   []string{FaultNATSOutage},
		MayFire: []string{FaultOutageBridgeKill, FaultNATSRestart, FaultLeaderKill, FaultMetaLeaderChange},
		// Errors must be over half the attempts of the rate's range.
		BuildUp: 5 * time.Minute / AlertTimeScale,
	},
	"PlegBridgeDeliveryStalled": {
		Fires:   []string{FaultNATSOutage},
		MayFire: []string{FaultOutageBridgeKill},
		// No ack in the whole range of increase().
		BuildUp: 10 * time.Minute / AlertTimeScale,
	},
	"PlegBridgeOutboxFilling": {
		Fires:   []string{FaultNATSOutage},
		MayFire: []string{FaultOutageBridgeKill, FaultNATSRestart, FaultLeaderKill, FaultMetaLeaderChange},
		BuildUp: 3 * time.Second, // AlertingOutboxSize events at 200 a second
	},
	"PlegBridgeSpoolFilling": {
		Fires:   []string{FaultNATSOutage},
		MayFire: []string{FaultOutageBridgeKill},
		BuildUp: 10 * time.Second, // the outbox, then half of soakSpoolBytes, at 200 events a second
	},
	"PlegBridgeEventsHeldBack": {
		Fires:   []string{FaultNATSOutage},
		MayFire: []string{FaultOutageBridgeKill},
		BuildUp: 15 * time.Second, // the outbox, then all of soakSpoolBytes
	},
	"PlegBridgeEventStreamDisconnected": {
		Fires: []string{FaultStreamRefused},
		// After the refusals, the bridge's next attempt comes within its
		// longest backoff (generator.DefaultStreamBackoffMax, 30 s, 36 s
		// with its jitter).
		ResolveWithin: 36*time.Second + resolveSlack,
	},
	"PlegBridgeEventStreamNotTrusted": {
		NotExpected: "needs an event stream that stays open but misses transitions for an hour (2 minutes in the soak) while pods churn; the simulated runtime's stream delivers every event it emits, and no fault makes it lose some",
	},
	"PlegBridgeStateWritesFailing": {
		MayFire:     []string{FaultNATSOutage, FaultOutageBridgeKill},
		NotExpected: "needs writes to the state bucket failing while the stream takes events (the bucket's permissions or room); a NATS outage stops both, and the bridge writes a key only for an event the stream stored, so it fires only if the outage found writes waiting, and does not have to",
	},
	"PlegBridgeDown": {
		Fires:   []string{FaultBridgeKill},
		MayFire: []string{FaultOutageBridgeKill},
	},
	"PlegBridgeAbsent": {
		Fires: []string{FaultBridgeGone},
		// The bridge drains on SIGTERM (a second or two) before its
		// target goes, and Prometheus reads the target file again within
		// a scrape interval.
		BuildUp: 3 * time.Second,
	},
	"PlegBridgeNotOnEveryNode": {
		NotExpected: "reads kube-state-metrics' view of the DaemonSet, which a soak has neither",
	},
}

// deadline is how long after its fault began the alert must have fired.
func (e alertExpectation) deadline(r rule) time.Duration {
	return e.BuildUp + duration(r.For) + 2*scrapeInterval + notifySlack
}

func (e alertExpectation) resolveWithin() time.Duration {
	if e.ResolveWithin > 0 {
		return e.ResolveWithin
	}
	return resolveSlack
}

// Episode is one firing of an alert, as Alertmanager notified it.
type Episode struct {
	Fired    time.Time
	Resolved time.Time // zero while it fires
}

// alertReceiver is the webhook Alertmanager notifies: it records when each
// alert fired and resolved, by the time the notification arrived. Its
// methods are safe for concurrent use.
type alertReceiver struct {
	mu       sync.Mutex
	episodes map[string][]Episode // by alert name; guarded by mu
	changed  chan struct{}        // closed and replaced at each change; guarded by mu
	srv      *http.Server
	lis      net.Listener
}

// newAlertReceiver listens on a loopback port; Run serves.
func newAlertReceiver() (*alertReceiver, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for alerts: %w", err)
	}
	r := &alertReceiver{episodes: map[string][]Episode{}, changed: make(chan struct{}), lis: lis}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /alerts", r.serveAlerts)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return r, nil
}

// url is the webhook's address.
func (r *alertReceiver) url() string { return "http://" + r.lis.Addr().String() + "/alerts" }

// Run serves until ctx is done.
func (r *alertReceiver) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- r.srv.Serve(r.lis) }() // joined below
	select {
	case err := <-errc:
		return fmt.Errorf("serve alerts: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := r.srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// webhookMessage is the part of Alertmanager's webhook payload the soak
// reads.
type webhookMessage struct {
	Alerts []struct {
		Status string            `json:"status"` // firing or resolved
		Labels map[string]string `json:"labels"`
	} `json:"alerts"`
}

func (r *alertReceiver) serveAlerts(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	var msg webhookMessage
	if err := json.NewDecoder(req.Body).Decode(&msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, a := range msg.Alerts {
		r.record(a.Labels["alertname"], a.Status == "firing", now)
	}
}

// record notes that alert fired or resolved at t. A repeated notification
// of the same state changes nothing.
func (r *alertReceiver) record(alert string, firing bool, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	eps := r.episodes[alert]
	open := len(eps) > 0 && eps[len(eps)-1].Resolved.IsZero()
	switch {
	case firing && !open:
		r.episodes[alert] = append(eps, Episode{Fired: t})
	case !firing && open:
		eps[len(eps)-1].Resolved = t
	default:
		return
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// snapshot returns the episodes so far, and a channel closed at the next
// change.
func (r *alertReceiver) snapshot() (map[string][]Episode, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]Episode, len(r.episodes))
	for k, v := range r.episodes {
		out[k] = slices.Clone(v)
	}
	return out, r.changed
}

// waitFor waits until cond holds over the episodes, until deadline, or ctx
// ends; it reports whether cond held.
func (r *alertReceiver) waitFor(ctx context.Context, deadline time.Time, cond func(map[string][]Episode) bool) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		eps, changed := r.snapshot()
		if cond(eps) {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// AlertResult is one alert's row of the report.
type AlertResult struct {
	Alert string
	// Expected are the faults that must fire it; none if no fault does,
	// and then NotExpected says why.
	Expected    []FaultRecord
	NotExpected string
	// FiredBy are the faults that fire it, in this schedule or not.
	FiredBy  []string
	Episodes []Episode
	// Problems says what is wrong; none if the alert behaved.
	Problems []string
}

// judgeAlerts compares what fired with what the faults should have fired:
// every alert a fault of the schedule is expected to fire fired in that
// fault's window within its deadline, and resolved before the window
// ended (plus its resolve time); nothing fired outside the windows of the
// faults that may fire it; everything resolved. windows are the schedule's
// (a fault's window is named after it). It is a pure function.
func judgeAlerts(rules []rule, windows []Window, faults []FaultRecord, episodes map[string][]Episode) []AlertResult {
	var out []AlertResult
	for _, r := range rules {
		exp, ok := alertExpectations[r.Alert]
		res := AlertResult{Alert: r.Alert, Episodes: episodes[r.Alert], NotExpected: exp.NotExpected, FiredBy: exp.Fires}
		if !ok {
			res.NotExpected = "-"
			res.Problems = append(res.Problems, "no fault of the soak is known to fire it, and no reason why none can is given (harness/soak/alerts.go)")
		}
		for _, f := range faults {
			if !slices.Contains(exp.Fires, f.Name) {
				continue
			}
			w := faultWindow(windows, f)
			res.Expected = append(res.Expected, f)
			deadline := f.At.Add(exp.deadline(r))
			found := -1
			for i, ep := range res.Episodes {
				if !ep.Fired.Before(f.At) && !ep.Fired.After(w.To) {
					found = i
					break
				}
			}
			if found < 0 {
				res.Problems = append(res.Problems, fmt.Sprintf("did not fire in the %s window", f.Name))
				continue
			}
			ep := res.Episodes[found]
			if ep.Fired.After(deadline) {
				res.Problems = append(res.Problems, fmt.Sprintf("fired %v after %s began, later than its %v", roundDelay(ep.Fired.Sub(f.At)), f.Name, exp.deadline(r)))
			}
		}
		for _, ep := range res.Episodes {
			if ep.Resolved.IsZero() {
				res.Problems = append(res.Problems, fmt.Sprintf("fired at %s and never resolved", ep.Fired.Format(time.RFC3339)))
			}
			w, ok := allowedWindow(windows, faults, exp, ep.Fired)
			if !ok {
				res.Problems = append(res.Problems, fmt.Sprintf("fired at %s, in no window of a fault that fires it", ep.Fired.Format(time.RFC3339)))
				continue
			}
			if !ep.Resolved.IsZero() && ep.Resolved.After(w.To.Add(exp.resolveWithin())) {
				res.Problems = append(res.Problems, fmt.Sprintf("resolved %v after the %s window ended, later than %v", roundDelay(ep.Resolved.Sub(w.To)), w.Name, exp.resolveWithin()))
			}
		}
		out = append(out, res)
	}
	return out
}

// faultWindow returns the window a fault ran in.
func faultWindow(windows []Window, f FaultRecord) Window {
	for _, w := range windows {
		if w.Name == f.Name && !f.At.Before(w.From) && (w.To.IsZero() || f.At.Before(w.To)) {
			return w
		}
	}
	return Window{Name: f.Name, From: f.At, To: f.At}
}

// allowedWindow returns the window of a fault that fires or may fire the
// alert, in which t falls.
func allowedWindow(windows []Window, faults []FaultRecord, exp alertExpectation, t time.Time) (Window, bool) {
	for _, f := range faults {
		if !slices.Contains(exp.Fires, f.Name) && !slices.Contains(exp.MayFire, f.Name) {
			continue
		}
		w := faultWindow(windows, f)
		if !t.Before(w.From) && !t.After(w.To) {
			return w, true
		}
	}
	return Window{}, false
}

// alertBaseline is the least time the baseline and the recovery windows
// of a soak with Prometheus last: a few of the rules' ranges, over which
// nothing may fire.
const alertBaseline = 15 * time.Second

// loadAlerting reads the rules and renders them for the soak, and reads
// the dashboard's queries.
func (opts *Options) loadAlerting() error {
	if opts.RulesFile == "" || opts.DashboardFile == "" {
		return errors.New("the rules file or the dashboard is not set")
	}
	shipped, err := os.ReadFile(opts.RulesFile)
	if err != nil {
		return fmt.Errorf("read the alerting rules: %w", err)
	}
	if opts.renderedRules, opts.rules, err = renderRules(shipped, AlertTimeScale); err != nil {
		return fmt.Errorf("%s: %w", opts.RulesFile, err)
	}
	model, err := os.ReadFile(opts.DashboardFile)
	if err != nil {
		return fmt.Errorf("read the dashboard: %w", err)
	}
	if opts.dashboard, err = parseDashboard(model); err != nil {
		return fmt.Errorf("%s: %w", opts.DashboardFile, err)
	}
	return nil
}

// alertsOf returns the rendered rules of the alerts fault must fire.
func (opts Options) alertsOf(fault string) []rule {
	var out []rule
	for _, r := range opts.rules {
		if slices.Contains(alertExpectations[r.Alert].Fires, fault) {
			out = append(out, r)
		}
	}
	return out
}

// alertBudget is the time a fault's window needs with Prometheus: the
// fault held until the last of its alerts must have fired, a repair, and
// the time they may take to resolve.
func (opts Options) alertBudget(fault string) time.Duration {
	var d time.Duration
	for _, r := range opts.alertsOf(fault) {
		exp := alertExpectations[r.Alert]
		d = max(d, exp.deadline(r)+2*time.Second+exp.resolveWithin())
	}
	return d
}

// alertingDuration is the least Duration a soak with Prometheus takes.
func (opts Options) alertingDuration() time.Duration {
	d := 2 * alertBaseline
	for _, f := range opts.Faults {
		d += opts.faultBudget(f)
	}
	return d
}
