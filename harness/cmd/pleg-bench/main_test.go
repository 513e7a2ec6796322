package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/latencybench"
)

// TestMain lets the latency harness re-execute the test binary as the
// simulated runtime's process, as main does.
func TestMain(m *testing.M) {
	latencybench.MaybeRunRuntimeProcess()
	maybeRunChild()
	os.Exit(m.Run())
}

func TestRunRejectsBadFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "an unknown mode is named", args: []string{"--modes=raw,fast"}, want: `--modes="raw,fast": unknown mode "fast"`},
		{name: "an unknown runtime topology is named", args: []string{"--runtime=container"},
			want: `--runtime="container": unknown runtime topology "container" (want process or inprocess)`},
		{name: "a rate must be positive", args: []string{"--rate=0"}, want: "--rate=0: must be positive"},
		{name: "a duration must be positive", args: []string{"--duration=0s"}, want: "--duration=0s: must be positive"},
		{name: "arguments are refused", args: []string{"evented"}, want: `unexpected arguments ["evented"]`},
		{name: "a node size needs pods and containers", args: []string{"--sizes=110"}, want: `--sizes="110": node size "110": want pods/containers`},
		{name: "repetitions must be at least one", args: []string{"--reps=0"}, want: "--reps=0: must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr strings.Builder
			err := run(t.Context(), tt.args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
		})
	}
}

func TestRunPrintsTheLatencyTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		topology string
	}{
		{name: "the runtime runs in a child process by default",
			topology: "the simulated runtime runs in a child process (--runtime process)"},
		{name: "the runtime runs in the bridge's process on request", args: []string{"--runtime=inprocess"},
			topology: "the simulated runtime runs in the bridge's process (--runtime inprocess)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr strings.Builder
			args := append([]string{"--idle=false", "--relist=false", "--throughput=false", "--modes=raw,evented", "--rate=100", "--duration=300ms", "--warmup=100ms", "--stages"}, tt.args...)
			if err := run(t.Context(), args, &stdout, &stderr); err != nil {
				t.Fatalf("run(%q) = %v; stderr:\n%s", args, err, stderr.String())
			}
			out := stdout.String()
			for _, want := range []string{
				tt.topology, "mode     events  acked  p50", "\nraw      30      30 ", "\nevented  30      30 ",
				"stages, p50 / p99", "verdict: target evented p99 ≤ 2× raw p99",
				"p99     p99.9", "\nlatency p99.9, evented ",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestRunPrintsIdleCPUAndPeakRSSBesideTheirBaselines(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	args := []string{"--modes=", "--relist=false", "--throughput=false", "--sizes=10/20", "--rss-sizes=", "--window=1s", "--reps=2", "--settle=0s"}
	if err := run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v; stderr:\n%s", args, err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"idle cpu, generic, 10/20", "bare loop", "idle cpu, evented, 10/20", "bare Go process",
		"peak RSS, generic, 10/20", "peak RSS, evented, 10/20", " MiB",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestRunPrintsTheRelistCostBesideTheBareListRoundTrip(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	args := []string{"--modes=", "--idle=false", "--throughput=false", "--relist-sizes=4/8", "--reps=1"}
	if err := run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v; stderr:\n%s", args, err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"relist time, steady, 4/8", "relist allocs, steady, 4/8", "relist bytes, first, 4/8", "bare List",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestRunPrintsThroughputBesideTheRawDecodeAndPublish(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	args := []string{"--modes=", "--idle=false", "--relist=false", "--throughput-rate=200", "--throughput-duration=1s", "--reps=1"}
	if err := run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v; stderr:\n%s", args, err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"throughput: transitions made, evented, asked 200/s for 1s", "transitions missing from the stream", "0 met",
		"bridge cpu per transition", "stream decode + async publish",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestMinMadeRateLeavesOutTheChurnsLastPodsOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		rate     float64
		duration time.Duration
		want     float64
	}{
		{"10,400/s for 5 s must make at least 10,000/s", 10_400, 5 * time.Second, 10_000},
		{"10,000/s for 5 s must make at least 9,660/s", 10_000, 5 * time.Second, 9_660},
		{"200/s for 1 s, a sixth of it the tail, must make at least 166/s", 200, time.Second, 166},
		{"a churn shorter than the tail need make nothing", 1000, 100 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := minMadeRate(tc.rate, tc.duration); got != tc.want {
				t.Errorf("minMadeRate(%v, %v) = %v, want %v", tc.rate, tc.duration, got, tc.want)
			}
		})
	}
}
