package main

import (
	"fmt"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/latencybench"
)

// latencyRows turns the latency harness's results, repetitions in order,
// into the summary's rows: each bridge mode's p50 and p99 against raw
// JetStream publish→ack of the same repetition.
func latencyRows(results []latencybench.Result) []measurement {
	var raws []latencybench.Result
	byMode := map[latencybench.Mode][]latencybench.Result{}
	var order []latencybench.Mode
	for _, r := range results {
		if r.Mode == latencybench.ModeRaw {
			raws = append(raws, r)
			continue
		}
		if byMode[r.Mode] == nil {
			order = append(order, r.Mode)
		}
		byMode[r.Mode] = append(byMode[r.Mode], r)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	var rows []measurement
	for _, mode := range order {
		rs := byMode[mode]
		for _, q := range []struct {
			name string
			of   func(latencybench.Summary) time.Duration
		}{
			{"p50", func(s latencybench.Summary) time.Duration { return s.P50 }},
			{"p99", func(s latencybench.Summary) time.Duration { return s.P99 }},
			{"p99.9", func(s latencybench.Summary) time.Duration { return s.P999 }},
		} {
			m := measurement{name: fmt.Sprintf("latency %s, %s", q.name, mode), unit: milliseconds}
			for _, r := range rs {
				m.values = append(m.values, ms(q.of(r.Latency)))
			}
			if len(raws) == len(rs) {
				m.baseName = "raw publish→ack"
				for _, r := range raws {
					m.base = append(m.base, ms(q.of(r.Latency)))
				}
			}
			if q.name == "p99" && mode == latencybench.ModeEvented && m.baseName != "" {
				m.target, m.met = fmt.Sprintf("≤%d×", latencybench.TargetRatio), medianRatioAtMost(latencybench.TargetRatio)
			}
			rows = append(rows, m)
		}
	}
	return rows
}
