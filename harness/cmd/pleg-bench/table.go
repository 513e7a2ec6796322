package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// measurement is one row of the summary table: a figure measured once per
// repetition, the baseline it is compared with, measured in the same
// repetitions, and the target it must meet.
type measurement struct {
	name   string
	unit   unit
	values []float64 // one per repetition
	// base and baseName are the same-run baseline, one value per
	// repetition (none: the row has no baseline).
	baseName string
	base     []float64
	// target is the row's target in words; met says whether the values
	// meet it (nil: no verdict).
	target string
	met    func(m measurement) bool
}

// unit formats a value: its number, and its suffix once per cell.
type unit struct {
	format func(v float64) string
	suffix string
}

var (
	cpuPerMinute  = unit{func(v float64) string { return fmt.Sprintf("%.3g", v) }, " cpu-s/min"}
	coreShare     = unit{func(v float64) string { return fmt.Sprintf("%.3g", v) }, "% of a core"}
	mebibytes     = unit{func(v float64) string { return fmt.Sprintf("%.0f", v) }, " MiB"}
	milliseconds  = unit{sig3, " ms"}
	perSecond     = unit{func(v float64) string { return fmt.Sprintf("%.0f", v) }, "/s"}
	microseconds  = unit{func(v float64) string { return fmt.Sprintf("%.3g", v) }, " µs"}
	count         = unit{func(v float64) string { return fmt.Sprintf("%.0f", v) }, ""}
	mebibytesFine = unit{func(v float64) string { return fmt.Sprintf("%.3g", v) }, " MiB"}
	times         = unit{sig3, "×"}
)

// ratios returns value/base for each repetition.
func (m measurement) ratios() []float64 {
	if len(m.base) != len(m.values) {
		return nil
	}
	out := make([]float64, len(m.values))
	for i, v := range m.values {
		out[i] = v / m.base[i]
	}
	return out
}

// spread formats the median and the range of vs with f: "m (lo…hi)", or
// just m for a single value.
func spread(vs []float64, f unit) string {
	if len(vs) == 0 {
		return "-"
	}
	lo, hi := f.format(slices.Min(vs)), f.format(slices.Max(vs))
	if lo == hi {
		return f.format(median(vs)) + f.suffix
	}
	return fmt.Sprintf("%s (%s…%s)%s", f.format(median(vs)), lo, hi, f.suffix)
}

// writeMeasurements prints the summary table.
func writeMeasurements(w io.Writer, rows []measurement) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measurement\tmedian (min…max)\tbaseline, same run\tratio\ttarget\t")
	for _, m := range rows {
		base, ratio := "-", "-"
		if m.baseName != "" {
			base = m.baseName + " " + spread(m.base, m.unit)
			ratio = spread(m.ratios(), times)
		}
		verdict := m.target
		if m.met != nil {
			if m.met(m) {
				verdict += " met"
			} else {
				verdict += " MISSED"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", m.name, spread(m.values, m.unit), base, ratio, strings.TrimSpace(verdict))
	}
	return tw.Flush()
}

// medianRatioAtMost is a verdict: the median ratio is at most limit.
func medianRatioAtMost(limit float64) func(m measurement) bool {
	return func(m measurement) bool { return median(m.ratios()) <= limit }
}

// medianAtMost is a verdict: the median value is at most limit.
func medianAtMost(limit float64) func(m measurement) bool {
	return func(m measurement) bool { return median(m.values) <= limit }
}

// maxAtMost is a verdict: every value is at most limit.
func maxAtMost(limit float64) func(m measurement) bool {
	return func(m measurement) bool { return len(m.values) > 0 && slices.Max(m.values) <= limit }
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// sig3 formats v with three significant digits, without an exponent: all
// the digits of an integer part of more than three.
func sig3(v float64) string {
	if math.Abs(v) < 1 {
		return fmt.Sprintf("%.3g", v)
	}
	digits := 1
	for a := math.Abs(v); a >= 10; a /= 10 {
		digits++
	}
	return fmt.Sprintf("%.*f", max(0, 3-digits), v)
}
