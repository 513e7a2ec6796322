package latencybench_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/latencybench"
)

// BenchmarkDetectionLatency runs the detection latency harness briefly: 2 s
// of measurement at 1,000 transitions/s per mode, after a 0.5 s warmup, on
// one NATS server. It reports the latency percentiles of each mode in
// microseconds (the average over the runs when -benchtime asks for several),
// the ratio of the p99 to the raw p99 once raw has run, and the events lost,
// which fail it. ns/op, the duration of a run, is suppressed: it measures
// nothing. go run ./harness/cmd/pleg-bench runs the full 10 s version.
func BenchmarkDetectionLatency(b *testing.B) {
	h, err := latencybench.Start(b.Context(), latencybench.Config{
		Duration: 2 * time.Second, Warmup: 500 * time.Millisecond, Dir: b.TempDir(),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.Close)
	var rawP99 time.Duration
	for _, mode := range []latencybench.Mode{latencybench.ModeRaw, latencybench.ModeEvented, latencybench.ModeContainerd, latencybench.ModeGeneric} {
		b.Run(string(mode), func(b *testing.B) {
			var p50, p99, maxLat time.Duration
			lost, runs := 0, 0
			for b.Loop() {
				r, err := h.Run(b.Context(), mode)
				if err != nil {
					b.Fatal(err)
				}
				if r.Lost() > 0 {
					b.Errorf("%s: %d of %d events never acked", mode, r.Lost(), r.Expected)
				}
				runs++
				lost += r.Lost()
				p50 += r.Latency.P50
				p99 += r.Latency.P99
				maxLat = max(maxLat, r.Latency.Max)
			}
			p50, p99 = p50/time.Duration(runs), p99/time.Duration(runs)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(p50)/float64(time.Microsecond), "p50-µs")
			b.ReportMetric(float64(p99)/float64(time.Microsecond), "p99-µs")
			b.ReportMetric(float64(maxLat)/float64(time.Microsecond), "max-µs")
			b.ReportMetric(float64(lost), "lost")
			if mode == latencybench.ModeRaw {
				rawP99 = p99
			} else if rawP99 > 0 {
				b.ReportMetric(float64(p99)/float64(rawP99), "p99/raw")
			}
		})
	}
}

// TestHarnessMeasuresEveryMode runs each mode for half a second at a low rate
// with a fast relist, with the simulated runtime in a process of its own and
// in the harness's, and checks that every transition is acked once and
// timed.
func TestHarnessMeasuresEveryMode(t *testing.T) {
	for _, runtime := range []latencybench.RuntimeTopology{latencybench.RuntimeProcess, latencybench.RuntimeInProcess} {
		t.Run(string(runtime), func(t *testing.T) {
			h, err := latencybench.Start(t.Context(), latencybench.Config{
				Rate: 200, Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond,
				RelistPeriod: 100 * time.Millisecond, Runtime: runtime, Dir: t.TempDir(),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Close)
			for _, mode := range []latencybench.Mode{latencybench.ModeRaw, latencybench.ModeEvented, latencybench.ModeContainerd, latencybench.ModeGeneric} {
				r, err := h.Run(t.Context(), mode)
				if err != nil {
					t.Fatalf("Run(%s): %v", mode, err)
				}
				if r.Expected != 100 || r.Acked != r.Expected || r.Duplicates != 0 || r.Latency.Count != r.Acked {
					t.Errorf("%s: %d expected, %d acked, %d duplicates, %d timed; want 100 of each and no duplicate",
						mode, r.Expected, r.Acked, r.Duplicates, r.Latency.Count)
				}
				if r.Latency.P50 <= 0 || r.Latency.P50 > r.Latency.P99 || r.Latency.P99 > r.Latency.P999 || r.Latency.P999 > r.Latency.Max {
					t.Errorf("%s: latencies out of order: %+v", mode, r.Latency)
				}
				if mode == latencybench.ModeGeneric && r.ByRelist != r.Acked {
					t.Errorf("%s: %d of %d events detected by a relist, want all", mode, r.ByRelist, r.Acked)
				}
				// Following containerd's events, the exits come from the
				// tasks' exits, the rest from relists.
				if mode == latencybench.ModeContainerd && (r.ByRelist == 0 || r.ByRelist == r.Acked) {
					t.Errorf("%s: %d of %d events detected by a relist, want the exits from the tasks' exits and the rest by relists", mode, r.ByRelist, r.Acked)
				}
				if want := runtime; mode != latencybench.ModeRaw && r.Runtime != want {
					t.Errorf("%s: measured with the runtime %q, want %q", mode, r.Runtime, want)
				}
			}
		})
	}
}

func TestWriteTable(t *testing.T) {
	t.Parallel()
	us := time.Microsecond
	results := []latencybench.Result{
		{Mode: latencybench.ModeRaw, Expected: 10000, Acked: 10000, Rate: 1000,
			Latency: latencybench.Summary{Count: 10000, P50: 180 * us, P90: 250 * us, P99: 400 * us, P999: 900 * us, Max: 2 * time.Millisecond}},
		{Mode: latencybench.ModeEvented, Expected: 10000, Acked: 10000, Rate: 1000,
			Latency: latencybench.Summary{Count: 10000, P50: 450 * us, P90: 700 * us, P99: 1100 * us, P999: 4 * time.Millisecond, Max: 9 * time.Millisecond}},
		{Mode: latencybench.ModeGeneric, Expected: 10000, Acked: 9990, ByRelist: 9990, Rate: 1000,
			Latency: latencybench.Summary{Count: 9990, P50: 510 * time.Millisecond, P90: 920 * time.Millisecond, P99: 1012 * time.Millisecond, P999: 1090 * time.Millisecond, Max: 1100 * time.Millisecond}},
	}
	var sb strings.Builder
	if err := latencybench.WriteTable(&sb, results); err != nil {
		t.Fatal(err)
	}
	want := `mode     events  acked  p50    p90    p99     p99.9   max     p99/raw
raw      10000   10000  180µs  250µs  400µs   900µs   2.00ms  1.0×
evented  10000   10000  450µs  700µs  1.10ms  4.00ms  9.00ms  2.8×
generic  10000   9990   510ms  920ms  1.01s   1.09s   1.10s   2530×

raw       1000 transitions/s achieved, nothing lost
evented   1000 transitions/s achieved, 10000 detected by the event stream, 0 by a relist, nothing lost
generic   1000 transitions/s achieved, 0 detected by the event stream, 9990 by a relist, LOST 10 of 10000
verdict: target evented p99 ≤ 2× raw p99 MISSED: evented p99 1.10ms is 2.8× raw p99 400µs; generic p99 1.01s is 920× evented's
`
	if got := sb.String(); got != want {
		t.Errorf("WriteTable wrote:\n%s\nwant:\n%s", got, want)
	}
	results[1].Runtime, results[1].CPU, results[1].RuntimeCPU = latencybench.RuntimeProcess, 0.5, 0.25
	sb.Reset()
	if err := latencybench.WriteTable(&sb, results); err != nil {
		t.Fatal(err)
	}
	if want := "\nevented   1000 transitions/s achieved, bridge process cpu 0.50 cores, runtime process cpu 0.25 cores, 10000 detected"; !strings.Contains(sb.String(), want) {
		t.Errorf("WriteTable of a run in the process topology wrote:\n%s\nwant a line containing %q", sb.String(), want)
	}
	results[1].Latency.P99 = 1300 * us
	if v := latencybench.Verdict(results); !strings.Contains(v, "MISSED") {
		t.Errorf("Verdict with evented p99 3.25× raw = %q, want MISSED", v)
	}
}
