package soak

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
)

// newTestRunner returns a Runner whose churn makes nothing until it is
// stopped, with faults that only record when they were injected.
func newTestRunner(progress *bytes.Buffer, faults ...string) (*Runner, *[]time.Time) {
	var injected []time.Time
	r := &Runner{
		Duration:        300 * time.Millisecond,
		Faults:          faults,
		QuietAfterFault: 10 * time.Millisecond,
		Stream:          "RUNNER",
		SettleTimeout:   5 * time.Second,
		Progress:        NewProgress(progress, slog.New(slog.DiscardHandler), "test"),
		Baseline:        "baseline: nothing",
		Churn: func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		},
		Count:       func() int { return 0 },
		Transitions: func() []Transition { return nil },
		Inject: func(_ context.Context, fault string, at time.Time) (string, error) {
			injected = append(injected, at)
			return "did " + fault, nil
		},
		Stop: func(context.Context, time.Time, int) {},
	}
	return r, &injected
}

func TestRunnerRunsTheWindowsInOrder(t *testing.T) {
	t.Parallel()
	n, err := startNATS(t.TempDir(), false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.shutdown)
	nc, js, err := connectNATS(n.urls)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "RUNNER", Subjects: []string{"runner.>"}}); err != nil {
		t.Fatal(err)
	}

	var progress bytes.Buffer
	r, injected := newTestRunner(&progress, "fault-a", "fault-b")
	r.JS = js
	startup := time.Now()
	r.Before = []Window{{Name: "start-up", From: startup}}
	closed, stops := 0, 0
	r.WindowClosed = func(context.Context) { closed++ }
	r.Stop = func(_ context.Context, _ time.Time, held int) {
		stops++
		if held != 0 {
			t.Errorf("Stop: the stream holds %d messages, want 0", held)
		}
	}
	out, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	var names []string
	for _, w := range out.Windows {
		names = append(names, w.Name)
	}
	if diff := cmp.Diff([]string{"start-up", "baseline", "fault-a", "fault-b", "recovery"}, names); diff != "" {
		t.Errorf("windows (-want +got):\n%s", diff)
	}
	for i, w := range out.Windows[:len(out.Windows)-1] {
		if !w.To.Equal(out.Windows[i+1].From) {
			t.Errorf("window %s ends at %v, the next begins at %v", w.Name, w.To, out.Windows[i+1].From)
		}
	}
	if !out.Windows[0].From.Equal(startup) || !out.Windows[1].From.Equal(out.Start) || !out.Windows[len(out.Windows)-1].To.Equal(out.End) {
		t.Errorf("windows %v: want them from the start-up, the baseline from the churn's start %v, to its end %v", out.Windows, out.Start, out.End)
	}
	if got := out.End.Sub(out.Start); got < r.Duration {
		t.Errorf("the churn ran %v, want at least Duration %v", got, r.Duration)
	}
	if len(*injected) != 2 || !(*injected)[0].Equal(out.Windows[2].From) || !(*injected)[1].Equal(out.Windows[3].From) {
		t.Errorf("faults injected at %v, want at the start of their windows %v", *injected, out.Windows[2:4])
	}
	if closed != 5 || stops != 1 {
		t.Errorf("%d windows closed and %d stops, want 5 (every window, the last once the churn stopped) and 1", closed, stops)
	}
	for _, line := range []string{"baseline: nothing", "fault-a: did fault-a", "fault-b: did fault-b", "recovery: no more faults", "churn stopped: 0 transitions made"} {
		if !strings.Contains(progress.String(), line) {
			t.Errorf("progress %q lacks %q", progress.String(), line)
		}
	}
	if len(out.Made) != 0 || len(out.Stored) != 0 || out.Accounting.Total.Expected != 0 {
		t.Errorf("outcome %+v, want nothing made or stored", out)
	}
}

func TestRunnerEndsEarly(t *testing.T) {
	t.Parallel()
	t.Run("a churn that fails ends the run with its error", func(t *testing.T) {
		t.Parallel()
		r, injected := newTestRunner(&bytes.Buffer{}, "fault-a")
		r.Duration = time.Hour
		r.Churn = func(context.Context) error { return errors.New("the runtime is gone") }
		_, err := r.Run(t.Context())
		if err == nil || err.Error() != "the runtime is gone" {
			t.Errorf("Run = %v, want the churn's error", err)
		}
		if len(*injected) != 0 {
			t.Errorf("faults injected after the churn failed: %v", *injected)
		}
	})

	t.Run("a process that exits on its own during a fault ends the run with its exit, and the churn is stopped", func(t *testing.T) {
		t.Parallel()
		r, _ := newTestRunner(&bytes.Buffer{}, "fault-a", "fault-b")
		crashed := make(chan struct{})
		r.Crash = func() (<-chan struct{}, func() error) {
			return crashed, func() error { return errors.New("bridge exited unexpectedly") }
		}
		r.Inject = func(context.Context, string, time.Time) (string, error) {
			close(crashed)
			return "", nil
		}
		churned := make(chan struct{})
		r.Churn = func(ctx context.Context) error {
			<-ctx.Done()
			close(churned)
			return nil
		}
		_, err := r.Run(t.Context())
		if err == nil || err.Error() != "bridge exited unexpectedly" {
			t.Errorf("Run = %v, want the crash", err)
		}
		select {
		case <-churned:
		default:
			t.Error("Run returned with the churn still running")
		}
	})
}
