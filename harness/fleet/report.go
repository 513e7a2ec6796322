package fleet

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// Report is the outcome of a fleet run.
type Report struct {
	soak.Accounting
	// Options are the run's, with defaults filled in.
	Options Options
	// Start is when the churn started, End when it stopped; the table
	// shows times from Start.
	Start, End time.Time
	// Startup is how long the bridge processes took, started together,
	// until every bridge had merged its first relist.
	Startup time.Duration
	// Settle is how long after the churn stopped the stream held as many
	// messages as transitions were made.
	Settle time.Duration
	// Faults says what each fault did and how long the fleet took to
	// drain after it, in order.
	Faults []FaultRecord
	// Figures are the latency, pending and server memory of each window,
	// in the order of Accounting.Windows.
	Figures []WindowFigures
	// Made is how many transitions the runtimes made, Stored how many
	// messages the stream held at the end.
	Made, Stored int
	// Undecodable describes the messages that were not pleg-bridge
	// CloudEvents.
	Undecodable []string
	// Dropped sums pleg_bridge_events_dropped_total over the bridge
	// processes, each as last asked (a killed one just before its kill).
	Dropped float64
	// State is the state bucket against the runtimes at the end.
	State StateCheck
	// Stream and Bucket are the stream's and the state bucket's stream's
	// figures at the end.
	Stream, Bucket StreamFigures
	// Servers, Bridges and Harness are the processes' memory and CPU over
	// the run: each server, each bridge process, and the harness (the
	// simulated runtimes and the churn).
	Servers, Bridges []Usage
	Harness          Usage
	// Problems are failures outside the accounting: a fleet not drained
	// after a fault, a process that did not stop cleanly, a state bucket
	// that differs from the runtimes.
	Problems []string
}

// FaultRecord is one injected fault.
type FaultRecord struct {
	Name string
	At   time.Time
	Note string // what happened, as measured
	// Repaired is when the servers or processes were started again.
	Repaired time.Time
	// Drain is how long after Repaired the last node was seen with
	// nothing pending; Drained is false if that did not happen within
	// Options.DrainTimeout.
	Drain   time.Duration
	Drained bool
	// Election, for FaultLeaderKill, is the time from the kill to the
	// servers' advisory that a new leader was elected; Stalls are the
	// nodes' stalls in the fault's window (nodeStalls).
	Election time.Duration
	Stalls   Stalls
	// Replaced, for FaultRollingDeploy, is how many pods it replaced, of
	// the fleet's Pods, and Rolled the transitions it made on top of the
	// churn.
	Replaced, Pods, Rolled int
}

// WindowFigures are the measurements of one window besides its accounting.
type WindowFigures struct {
	// P50 and P99 are percentiles of the time from a transition to its
	// storage in JetStream (the stream's own timestamp): detection,
	// publication and replication together, as a subscriber sees it.
	P50, P99 time.Duration
	// PeakPending is the most events the bridges held unacknowledged, in
	// memory and spools, fleet-wide, at one sample.
	PeakPending int
	// PeakServerRSS is the highest resident memory of any server at one
	// sample.
	PeakServerRSS int64
	// ServerCores is the servers' CPU in the window, summed over the
	// three, in cores (CPU seconds a second), between its first and last
	// sample; what a fault, a drain or a rollout of bridges costs them.
	ServerCores float64
	// Acks is how many publishes the bridges had acked in the window;
	// AckP50 and AckP99 estimate their publish→ack times from the
	// bridges' histograms (pleg_bridge_publish_ack_duration_seconds, as
	// Prometheus's histogram_quantile would).
	Acks           uint64
	AckP50, AckP99 time.Duration
	// RawAcks and RawErrors are the raw publisher's in the window;
	// RawP50 and RawP99 are its exact publish→ack times, RawBucketP99
	// its p99 estimated from the bridges' buckets, to compare like with
	// like.
	RawAcks, RawErrors int
	RawP50, RawP99     time.Duration
	RawBucketP99       time.Duration
}

// StreamFigures are a JetStream stream's state.
type StreamFigures struct {
	Msgs, Bytes, Subjects uint64
}

// Failed reports whether the run found anything wrong: a transition
// missing, duplicated or out of order, an unexpected or undecodable
// message, or a problem.
func (r Report) Failed() bool {
	return r.Accounting.Failed() || len(r.Undecodable) > 0 || len(r.Problems) > 0
}

// storedKey names a transition: a container's event of one type.
type storedKey struct{ id, typ string }

// firstStored returns the first copy the stream stored of each
// transition.
func firstStored(stored []soak.Stored) map[storedKey]soak.Stored {
	first := make(map[storedKey]soak.Stored, len(stored))
	for _, s := range stored {
		k := storedKey{s.ContainerID, s.Type}
		if old, ok := first[k]; !ok || s.Seq < old.Seq {
			first[k] = s
		}
	}
	return first
}

// windowFigures measures each window: latency from the transitions made
// in it to their first storage, and the monitor's peaks.
func (f *fleet) windowFigures(made []soak.Transition, stored []soak.Stored) []WindowFigures {
	first := firstStored(stored)
	out := make([]WindowFigures, len(f.windows))
	delays := make([][]time.Duration, len(f.windows))
	for _, t := range made {
		s, ok := first[storedKey{t.ContainerID, t.Type}]
		if !ok {
			continue
		}
		i, _ := slices.BinarySearchFunc(f.windows, t.At, func(w soak.Window, at time.Time) int {
			if !at.Before(w.To) {
				return -1
			}
			if at.Before(w.From) {
				return 1
			}
			return 0
		})
		i = min(i, len(f.windows)-1)
		delays[i] = append(delays[i], s.StoredAt.Sub(t.At))
	}
	for i, w := range f.windows {
		slices.Sort(delays[i])
		out[i].P50, out[i].P99 = percentile(delays[i], 0.5), percentile(delays[i], 0.99)
		if i < len(f.acks) {
			a := f.acks[i]
			out[i].Acks = a.bridges.Count
			out[i].AckP50, out[i].AckP99 = a.bridges.quantile(0.5), a.bridges.quantile(0.99)
			out[i].RawAcks, out[i].RawErrors = len(a.raw), a.rawErrors
			out[i].RawP50, out[i].RawP99 = percentile(a.raw, 0.5), percentile(a.raw, 0.99)
			if len(a.raw) > 0 {
				out[i].RawBucketP99 = bucketed(a.bridges.Bounds, a.raw).quantile(0.99)
			}
		}
		samples := f.mon.between(w.From, w.To)
		if n := len(samples); n >= 2 {
			if dt := samples[n-1].at.Sub(samples[0].at); dt > 0 {
				out[i].ServerCores = (samples[n-1].serverCPU - samples[0].serverCPU).Seconds() / dt.Seconds()
			}
		}
		for _, s := range samples {
			out[i].PeakPending = max(out[i].PeakPending, s.total)
			for _, rss := range s.serverRSS {
				out[i].PeakServerRSS = max(out[i].PeakServerRSS, rss)
			}
		}
	}
	return out
}

// percentile returns the q-quantile of sorted, 0 if it is empty.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1)+0.5)]
}

// streamFigures reads the stream's and the state bucket's state.
func (f *fleet) streamFigures(ctx context.Context) (stream, bucket StreamFigures) {
	read := func(name string) StreamFigures {
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := f.js.Stream(ictx, name)
		if err != nil {
			f.prog.Problem("read stream %s: %v", name, err)
			return StreamFigures{}
		}
		st := s.CachedInfo().State
		return StreamFigures{Msgs: st.Msgs, Bytes: st.Bytes, Subjects: st.NumSubjects}
	}
	return read(streamName), read("KV_" + stateBucket)
}

// Table writes the report for people: the settings, what each fault did,
// one line per window and a total, the processes' usage, the stream's and
// the bucket's figures, then every kind of finding, the first few of each.
func (r Report) Table(w io.Writer) error {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "fleet: %d nodes in %d bridge processes; %d pods of %d containers per node at the start; churn %.0f transitions/s fleet-wide (pod lifetime %v), seed %d\n",
		o.Nodes, len(r.Bridges), o.Pods, o.ContainersPerPod, o.Rate, o.Lifetime, o.Seed)
	fmt.Fprintf(&b, "       %d NATS servers (one process each), stream %s and state bucket %s with %d replicas, duplicate window %v\n",
		serversCount, streamName, stateBucket, replicas, duplicateWindow)
	fmt.Fprintf(&b, "start-up: every bridge ready (first relist merged) %v after the processes started\n", roundDelay(r.Startup))
	for _, f := range r.Faults {
		drained := fmt.Sprintf("every node drained %v after the repair", roundDelay(f.Drain))
		if !f.Drained {
			drained = fmt.Sprintf("NOT drained %v after the repair", roundDelay(f.Drain))
		}
		if f.Stalls.Nodes > 0 {
			drained += fmt.Sprintf("; per node stall p50 %v, max %v over %d nodes, against the election's %v",
				roundDelay(f.Stalls.P50), roundDelay(f.Stalls.Max), f.Stalls.Nodes, roundDelay(f.Election))
		}
		fmt.Fprintf(&b, "  %8s  %-16s %s; %s\n", r.offset(f.At), f.Name, f.Note, drained)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\tfrom\tto\tmade\tstored\tmissing\tduplicated\tout of order\tp50\tp99\tmax delay\tdrain\tpeak pending\tserver peak RSS\tserver CPU\t")
	for i, wr := range r.Windows {
		var fig WindowFigures
		if i < len(r.Figures) {
			fig = r.Figures[i]
		}
		drain := "-"
		for _, f := range r.Faults {
			if f.Name == wr.Name {
				drain = roundDelay(f.Drain).String()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%v\t%v\t%v\t%s\t%d\t%s\t%.0f%%\t\n", wr.Name, r.offset(wr.From), r.offset(wr.To),
			wr.Expected, wr.Found, wr.Missing, wr.Duplicated, wr.OutOfOrder, roundDelay(fig.P50), roundDelay(fig.P99), roundDelay(wr.MaxDelay),
			drain, fig.PeakPending, mib(fig.PeakServerRSS), 100*fig.ServerCores)
	}
	t := r.Total
	fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t\t\t%v\t\t\t\t\t\n", t.Name, r.offset(t.From), r.offset(t.To),
		t.Expected, t.Found, t.Missing, t.Duplicated, t.OutOfOrder, roundDelay(t.MaxDelay))
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := r.ackTable(&b); err != nil {
		return err
	}
	churn := r.End.Sub(r.Start)
	churned := r.Made
	if len(r.Windows) > 0 {
		churned -= r.Windows[0].Expected // the start-up's pods were there before the churn
	}
	rolled, byRollout := 0, ""
	for _, f := range r.Faults {
		rolled += f.Rolled
	}
	if rolled > 0 {
		byRollout = fmt.Sprintf(", %d of them by the rolling deployment or the node drain (the churn alone %.1f/s)", rolled, float64(churned-rolled)/churn.Seconds())
	}
	fmt.Fprintf(&b, "\ningest: %d transitions made in %v of churn, %.1f/s (target %.0f/s)%s; the stream held them %v after the churn stopped\n",
		churned, roundDelay(churn), float64(churned)/churn.Seconds(), o.Rate, byRollout, roundDelay(r.Settle))

	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "process\tnodes\tpeak RSS\tRSS at end\tCPU\tCPU share\tper node: peak RSS\tCPU share\tstore on disk\t")
	run := r.End.Sub(r.Start)
	share := func(cpu time.Duration) string { return fmt.Sprintf("%.1f%%", 100*cpu.Seconds()/run.Seconds()) }
	for _, u := range r.Servers {
		fmt.Fprintf(tw, "%s\t-\t%s\t%s\t%v\t%s\t\t\t%s\t\n", u.Name, mib(u.PeakRSS), mib(u.LastRSS), u.CPU.Round(10*time.Millisecond), share(u.CPU), mib(u.Disk))
	}
	for _, u := range append(slices.Clone(r.Bridges), r.Harness) {
		nodes, perRSS, perCPU := "-", "", ""
		if u.Nodes > 0 {
			nodes = fmt.Sprint(u.Nodes)
			perRSS = mib(u.PeakRSS / int64(u.Nodes))
			perCPU = fmt.Sprintf("%.3f%%", 100*u.CPU.Seconds()/run.Seconds()/float64(u.Nodes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\t%s\t%s\t\t\n", u.Name, nodes, mib(u.PeakRSS), mib(u.LastRSS), u.CPU.Round(10*time.Millisecond), share(u.CPU), perRSS, perCPU)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := r.Stream
	fmt.Fprintf(&b, "(CPU share: of one core, over the %v from the churn's start to its end; CPU counts the start-up too)\n", roundDelay(run))
	fmt.Fprintf(&b, "\nstream %s: %d messages, %s (%s a message), %d subjects (%.1f a node)\n",
		streamName, s.Msgs, mib(int64(s.Bytes)), perMessage(s.Bytes, s.Msgs), s.Subjects, float64(s.Subjects)/float64(o.Nodes))
	bk := r.Bucket
	fmt.Fprintf(&b, "state bucket %s: %d live keys (the runtimes hold %d containers and sandboxes), %d messages, %d subjects, %s; %d differences\n",
		stateBucket, r.State.Keys, r.State.Want, bk.Msgs, bk.Subjects, mib(int64(bk.Bytes)), len(r.State.Diffs))
	fmt.Fprintf(&b, "events the bridges gave up on (pleg_bridge_events_dropped_total): %v\n", r.Dropped)

	list := func(title string, fs []soak.Finding) {
		if len(fs) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s (%d):\n", title, len(fs))
		for _, f := range fs[:min(len(fs), maxListed)] {
			fmt.Fprintf(&b, "  %8s  %-16s %s %s of pod %s, stored at %v\n", r.offset(f.At), f.Window, f.Type, f.ContainerID, f.PodUID, f.Seqs)
		}
	}
	list("missing", r.Missing)
	list("duplicated", r.Duplicated)
	list("out of order", r.OutOfOrder)
	if len(r.Unexpected) > 0 {
		fmt.Fprintf(&b, "\nunexpected (%d): first at sequence %d, %s %s\n", len(r.Unexpected), r.Unexpected[0].Seq, r.Unexpected[0].Type, r.Unexpected[0].ContainerID)
	}
	for _, u := range r.Undecodable[:min(len(r.Undecodable), maxListed)] {
		fmt.Fprintf(&b, "undecodable: %s\n", u)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	if r.Failed() {
		b.WriteString("\nresult: FAILED\n")
	} else {
		b.WriteString("\nresult: every transition stored once, in order\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ackTable writes the publish→ack times per window, the bridges' against
// the raw publisher's, and the steady ratio the target is about.
func (r Report) ackTable(b *strings.Builder) error {
	b.WriteString("\npublish→ack: the bridges (estimated from their histograms' buckets) against a raw JetStream publisher in the same run (same subjects but the first token, same sizes, a stream of the same configuration)\n")
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\tbridge acks\tp50\tp99\traw acks\traw errors\traw p50\traw p99\traw p99 (buckets)\tp99 ratio\t")
	for i, wr := range r.Windows {
		if i >= len(r.Figures) {
			break
		}
		f := r.Figures[i]
		fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%d\t%d\t%v\t%v\t%v\t%s\t\n", wr.Name, f.Acks, roundAck(f.AckP50), roundAck(f.AckP99),
			f.RawAcks, f.RawErrors, roundAck(f.RawP50), roundAck(f.RawP99), roundAck(f.RawBucketP99), ratio(f.AckP99, f.RawBucketP99))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, wr := range r.Windows {
		if wr.Name != "baseline" || i >= len(r.Figures) {
			continue
		}
		f := r.Figures[i]
		fmt.Fprintf(b, "steady (baseline) publish→ack p99: bridges %v, raw %v by the same buckets (%v exact): %s the raw publisher's (target: within 2×)\n",
			roundAck(f.AckP99), roundAck(f.RawBucketP99), roundAck(f.RawP99), ratio(f.AckP99, f.RawBucketP99))
	}
	return nil
}

// roundAck rounds an ack time for people: acks take from tens of
// microseconds to seconds.
func roundAck(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return roundDelay(d)
}

// ratio is a/b as "1.3×", "-" where b is 0.
func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

// offset is t as seconds from the churn's start.
func (r Report) offset(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%.1fs", t.Sub(r.Start).Seconds())
}

func mib(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

func perMessage(bytes, msgs uint64) string {
	if msgs == 0 {
		return "-"
	}
	return fmt.Sprintf("%d B", bytes/msgs)
}
