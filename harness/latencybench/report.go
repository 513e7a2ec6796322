package latencybench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"
)

// TargetRatio is the target: evented p99 within this many times the raw
// JetStream p99 of the same run (issue 13; 3 before it). pleg-bench's
// table judges by it too.
const TargetRatio = 2

// Summary is the distribution of a set of latencies. P999 (p99.9) of a
// 5,000-event run is its fifth-slowest event: read it over repetitions.
type Summary struct {
	Count                    int
	P50, P90, P99, P999, Max time.Duration
}

// summarize sorts latencies in place and takes nearest-rank percentiles.
func summarize(latencies []time.Duration) Summary {
	if len(latencies) == 0 {
		return Summary{}
	}
	slices.Sort(latencies)
	return Summary{
		Count: len(latencies),
		P50:   percentile(latencies, 0.50),
		P90:   percentile(latencies, 0.90),
		P99:   percentile(latencies, 0.99),
		P999:  percentile(latencies, 0.999),
		Max:   latencies[len(latencies)-1],
	}
}

// percentile is the nearest-rank p-quantile of sorted, which is not empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// WriteTable writes one row per result, the ratio of each p99 to the raw
// p99 when raw was measured, a line per mode on how its events were
// detected, and the verdict on the target.
func WriteTable(w io.Writer, results []Result) error {
	var raw *Result
	for i := range results {
		if results[i].Mode == ModeRaw {
			raw = &results[i]
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tevents\tacked\tp50\tp90\tp99\tp99.9\tmax\tp99/raw")
	for _, r := range results {
		ratio := "-"
		if raw != nil && raw.Latency.P99 > 0 && r.Acked > 0 {
			ratio = formatRatio(float64(r.Latency.P99)/float64(raw.Latency.P99)) + "×"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Mode, r.Expected, r.Acked,
			FormatDuration(r.Latency.P50), FormatDuration(r.Latency.P90), FormatDuration(r.Latency.P99),
			FormatDuration(r.Latency.P999), FormatDuration(r.Latency.Max), ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "%-8s  %s\n", r.Mode, detail(r))
	}
	if err := writeStages(w, results); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, Verdict(results))
	return err
}

// writeStages writes the p50 and p99 of each stage of the bridge modes'
// events, if they were timed.
func writeStages(w io.Writer, results []Result) error {
	var timed []Result
	for _, r := range results {
		if len(r.Stages) > 0 {
			timed = append(timed, r)
		}
	}
	if len(timed) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nstages, p50 / p99 each (they do not add up to the total's percentiles):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	names := []string{StageStream, StageDetect, StageEncode, StageAck}
	fmt.Fprintf(tw, "mode\t%s\t%s\t%s\t%s\n", names[0], names[1], names[2], names[3])
	for _, r := range timed {
		fmt.Fprintf(tw, "%s", r.Mode)
		for _, name := range names {
			cell := "-"
			for _, st := range r.Stages {
				if st.Name == name {
					cell = FormatDuration(st.Latency.P50) + " / " + FormatDuration(st.Latency.P99)
				}
			}
			fmt.Fprintf(tw, "\t%s", cell)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func detail(r Result) string {
	s := fmt.Sprintf("%.0f transitions/s achieved", r.Rate)
	switch {
	case r.Runtime == RuntimeProcess:
		if r.CPU > 0 {
			s += fmt.Sprintf(", bridge process cpu %.2f cores", r.CPU)
		}
		if r.RuntimeCPU > 0 {
			s += fmt.Sprintf(", runtime process cpu %.2f cores", r.RuntimeCPU)
		}
	case r.CPU > 0:
		s += fmt.Sprintf(", process cpu %.2f cores", r.CPU)
	}
	if r.Mode != ModeRaw {
		s += fmt.Sprintf(", %d detected by the event stream, %d by a relist", r.Acked-r.ByRelist, r.ByRelist)
	}
	if r.Duplicates > 0 {
		s += fmt.Sprintf(", %d duplicate acks", r.Duplicates)
	}
	if lost := r.Lost(); lost > 0 {
		s += fmt.Sprintf(", LOST %d of %d", lost, r.Expected)
	} else {
		s += ", nothing lost"
	}
	return s
}

// Verdict says whether the results meet the target, evented p99 ≤
// TargetRatio × raw p99, with the numbers, and how generic mode compares.
func Verdict(results []Result) string {
	byMode := map[Mode]Result{}
	for _, r := range results {
		byMode[r.Mode] = r
	}
	raw, okRaw := byMode[ModeRaw]
	ev, okEv := byMode[ModeEvented]
	if !okRaw || !okEv || raw.Acked == 0 || ev.Acked == 0 {
		return "verdict: not judged, it needs acked raw and evented runs"
	}
	ratio := float64(ev.Latency.P99) / float64(raw.Latency.P99)
	met := "MET"
	if ratio > TargetRatio {
		met = "MISSED"
	}
	if ev.Lost() > 0 {
		met += fmt.Sprintf(" on latency, but evented mode LOST %d events", ev.Lost())
	}
	s := fmt.Sprintf("verdict: target evented p99 ≤ %d× raw p99 %s: evented p99 %s is %s× raw p99 %s",
		TargetRatio, met, FormatDuration(ev.Latency.P99), formatRatio(ratio), FormatDuration(raw.Latency.P99))
	if c, ok := byMode[ModeContainerd]; ok && c.Acked > 0 {
		s += fmt.Sprintf("; containerd-events p99 %s is %s× raw's", FormatDuration(c.Latency.P99),
			formatRatio(float64(c.Latency.P99)/float64(raw.Latency.P99)))
	}
	if gen, ok := byMode[ModeGeneric]; ok && gen.Acked > 0 {
		s += fmt.Sprintf("; generic p99 %s is %s× evented's", FormatDuration(gen.Latency.P99),
			formatRatio(float64(gen.Latency.P99)/float64(ev.Latency.P99)))
	}
	return s
}

// formatRatio prints a ratio with one decimal below 10 and none above.
func formatRatio(v float64) string {
	if v >= 9.95 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// FormatDuration prints d with about three significant digits: 180µs,
// 1.23ms, 512ms, 1.02s.
func FormatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return sig3(float64(d)/float64(time.Microsecond)) + "µs"
	case d < time.Second:
		return sig3(float64(d)/float64(time.Millisecond)) + "ms"
	}
	return sig3(d.Seconds()) + "s"
}

// sig3 prints v with three significant digits, or more above 1000, never in
// exponent form.
func sig3(v float64) string {
	switch {
	case v >= 99.95:
		return fmt.Sprintf("%.0f", v)
	case v >= 9.995:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
