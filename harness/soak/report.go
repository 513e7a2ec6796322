package soak

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// maxListed bounds each list of findings in the table; the report holds
// them all.
const maxListed = 20

// Report is the outcome of a soak.
type Report struct {
	Accounting
	// Options are the soak's, with defaults filled in.
	Options Options
	// Setup describes NATS ("one NATS server", "NATS cluster of 3 ...").
	Setup string
	// Start is when the churn started; the table shows times from it.
	Start time.Time
	// Faults says what each fault did, in order.
	Faults []FaultRecord
	// Stored is how many messages the stream held at the end.
	Stored int
	// Undecodable describes the messages that were not pleg-bridge
	// CloudEvents.
	Undecodable []string
	// BridgeDropped is the bridge's pleg_bridge_events_dropped_total, summed
	// over its processes (each one's count as last scraped; a process
	// killed with SIGKILL is scraped just before). Events it gave up on
	// show as missing too; this says whether the bridge knew.
	BridgeDropped float64
	// TaskMismatches is the bridge's pleg_bridge_task_event_mismatches_total,
	// summed over its fields and processes as BridgeDropped is: exits it
	// reported from containerd's task exits that CRI later reported
	// otherwise. Any fails the soak.
	TaskMismatches float64
	// Problems are failures outside the accounting: a bridge not ready
	// again after a fault, one that did not stop cleanly.
	Problems []string
	// Alerts has a row per alert of the rules, with Options.Prometheus:
	// which fault must fire it, when it fired and resolved, and what was
	// wrong with that.
	Alerts []AlertResult
	// Panels has the answer of each query of the dashboard, with
	// Options.Prometheus.
	Panels []PanelResult
}

// FaultRecord is one injected fault.
type FaultRecord struct {
	Name string
	At   time.Time
	Note string // what happened, as measured
}

// Failed reports whether the soak found anything wrong: a transition
// missing, duplicated or out of order, an unexpected or undecodable
// message, a /healthz failure while the bridge was up, an exit reported
// from containerd's task exit that CRI contradicted, or a problem.
func (r Report) Failed() bool {
	return r.Accounting.Failed() || len(r.Undecodable) > 0 || len(r.Problems) > 0 || r.TaskMismatches > 0 ||
		len(r.AlertProblems()) > 0 || len(r.EmptyPanels()) > 0
}

// AlertProblems lists what was wrong with the alerts, one line each.
func (r Report) AlertProblems() []string {
	var out []string
	for _, a := range r.Alerts {
		for _, p := range a.Problems {
			out = append(out, a.Alert+": "+p)
		}
	}
	return out
}

// EmptyPanels lists the dashboard's queries that failed or returned no
// series, one line each, naming the panel.
func (r Report) EmptyPanels() []string {
	var out []string
	for _, p := range r.Panels {
		switch {
		case p.Err != "":
			out = append(out, fmt.Sprintf("panel %s, query %s: %s: %s", p.Panel, p.RefID, p.Err, p.Expr))
		case p.Series == 0:
			out = append(out, fmt.Sprintf("panel %s, query %s: no series: %s", p.Panel, p.RefID, p.Expr))
		}
	}
	return out
}

// Table writes the report for people: the settings, what each fault did,
// one line per window and a total, then every kind of finding, the first
// few of each.
func (r Report) Table(w io.Writer) error {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "soak: %v of churn at %.0f transitions/s (%d containers per pod, lifetime %v, seed %d); %s; duplicate window %v, outbox %d, max in flight %d\n",
		o.Duration, o.Rate, o.ContainersPerPod, o.Lifetime, o.Seed, r.Setup, o.DuplicateWindow, o.OutboxSize, o.MaxInFlight)
	for _, f := range r.Faults {
		fmt.Fprintf(&b, "  %8s  %-18s %s\n", r.offset(f.At), f.Name, f.Note)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\tfrom\tto\texpected\tfound\tmissing\tunobservable\tduplicated\tout of order\tmax delay\t/healthz failures\t")
	row := func(wr WindowResult) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%d\t\n", wr.Name, r.offset(wr.From), r.offset(wr.To),
			wr.Expected, wr.Found, wr.Missing, wr.Unobservable, wr.Duplicated, wr.OutOfOrder, roundDelay(wr.MaxDelay), wr.HealthFailures)
	}
	for _, wr := range r.Windows {
		row(wr)
	}
	row(r.Total)
	if err := tw.Flush(); err != nil {
		return err
	}
	if d := r.Total.To.Sub(r.Total.From); d > 0 {
		fmt.Fprintf(&b, "\nchurn: %d transitions made, %.0f a second", r.Total.Expected, float64(r.Total.Expected)/d.Seconds())
	}
	fmt.Fprintf(&b, "\nstream: %d messages, %d unexpected, %d undecodable; bridge: %.0f events given up (pleg_bridge_events_dropped_total), %.0f task-event mismatches (pleg_bridge_task_event_mismatches_total)\n",
		r.Stored, len(r.Unexpected), len(r.Undecodable), r.BridgeDropped, r.TaskMismatches)

	r.list(&b, "missing", r.Missing)
	r.list(&b, "unobservable (the container lived and went while no bridge ran; containerd 1.7 keeps no event)", r.Unobservable)
	r.list(&b, "duplicated", r.Duplicated)
	r.list(&b, "out of order", r.OutOfOrder)
	listed(&b, "unexpected", r.Unexpected, func(s Stored) string {
		return fmt.Sprintf("sequence %d: %s of %s (pod %s), stored at %s", s.Seq, s.Type, s.ContainerID, s.PodUID, r.offset(s.StoredAt))
	})
	listed(&b, "undecodable", r.Undecodable, func(s string) string { return s })
	listed(&b, "/healthz failures", r.Health, func(h HealthFailure) string {
		return fmt.Sprintf("%s: %s", r.offset(h.At), h.Detail)
	})
	listed(&b, "problems", r.Problems, func(s string) string { return s })
	if len(r.Alerts) > 0 {
		if err := r.alertTable(&b); err != nil {
			return err
		}
	}
	if len(r.Panels) > 0 {
		fmt.Fprintf(&b, "\ndashboard: %d queries of its panels run over the soak, %d with no data\n", len(r.Panels), len(r.EmptyPanels()))
		for _, p := range r.EmptyPanels() {
			fmt.Fprintf(&b, "  %s\n", p)
		}
	}

	switch {
	case r.Failed():
		b.WriteString("\nFAIL\n")
	case len(r.Alerts) > 0:
		b.WriteString("\nPASS: every transition stored exactly once, in per-container order; every alert fired where expected and only there, and resolved; every dashboard query answered\n")
	default:
		b.WriteString("\nPASS: every transition stored exactly once, in per-container order\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r Report) list(b *strings.Builder, title string, fs []Finding) {
	listed(b, title, fs, func(f Finding) string {
		kind := "container"
		if f.Sandbox {
			kind = "sandbox"
		}
		s := fmt.Sprintf("%-16s %s %-16s of %s %s (pod %s)", f.Window, r.offset(f.At), f.Type, kind, f.ContainerID, f.PodUID)
		if len(f.Seqs) > 0 {
			s += fmt.Sprintf(", stored at sequence %v", f.Seqs)
		}
		return s
	})
}

func listed[T any](b *strings.Builder, title string, items []T, line func(T) string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s: %d", title, len(items))
	if len(items) > maxListed {
		fmt.Fprintf(b, " (the first %d)", maxListed)
	}
	b.WriteString("\n")
	for _, it := range items[:min(len(items), maxListed)] {
		fmt.Fprintf(b, "  %s\n", line(it))
	}
}

// offset shows a time as the time since the churn started.
func (r Report) offset(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("+%.1fs", t.Sub(r.Start).Seconds())
}

// roundDelay shows a delay to the millisecond below a second, to 0.1 s
// above.
func roundDelay(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// alertTable writes a row per alert: the faults that must fire it, when it
// fired and resolved (times since the churn started), and its verdict.
func (r Report) alertTable(b *strings.Builder) error {
	fmt.Fprintf(b, "\nalerts (deploy/prometheus/rules.yml, every time divided by %d; scrape and evaluation every %v):\n\n", AlertTimeScale, scrapeInterval)
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "alert\texpected in\tfired\tresolved\tverdict")
	var reasons []string
	for _, a := range r.Alerts {
		var exp []string
		for _, f := range a.Expected {
			exp = append(exp, fmt.Sprintf("%s (%s)", f.Name, r.offset(f.At)))
		}
		expected := strings.Join(exp, ", ")
		switch {
		case len(exp) > 0:
		case len(a.FiredBy) > 0:
			expected = "not here (" + strings.Join(a.FiredBy, ", ") + " not scheduled)"
		default:
			expected = "not expected"
			reasons = append(reasons, fmt.Sprintf("%s: %s", a.Alert, a.NotExpected))
		}
		var fired, resolved []string
		for _, ep := range a.Episodes {
			fired = append(fired, r.offset(ep.Fired))
			resolved = append(resolved, r.offset(ep.Resolved))
		}
		verdict := "ok"
		if len(a.Problems) > 0 {
			verdict = "FAIL: " + strings.Join(a.Problems, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Alert, expected, orDash(fired), orDash(resolved), verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(reasons) > 0 {
		b.WriteString("\nnot expected (no fault of the soak can fire them; docs/alerts.md says so too):\n")
		for _, s := range reasons {
			fmt.Fprintf(b, "  %s\n", s)
		}
	}
	return nil
}

func orDash(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ", ")
}
