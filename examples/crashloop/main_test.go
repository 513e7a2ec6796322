package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

func TestRunPrintsACrashLoopAndStopsOnCancel(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	died := generator.ContainerDied
	publishAll(t, js, []lifecycle{
		{pod: podA, typ: died, minutes: 1, exitCode: 1},
		{pod: podA, typ: died, minutes: 2, exitCode: 1},
		{pod: podA, typ: died, minutes: 3, exitCode: 1},
	}, 0)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out, stdout := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-nats-url", url, "-from-start", "-threshold", "3"}, stdout, io.Discard)
		stdout.Close()
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	select {
	case line := <-lines:
		if !strings.Contains(line, "CRASHLOOP default/web-a") || !strings.Contains(line, "3 crashes in 10m0s") {
			t.Errorf("report line %q, want default/web-a with 3 crashes in 10m0s", line)
		}
	case err := <-done:
		t.Fatalf("run returned %v before reporting", err)
	case <-time.After(waitTimeout):
		ws, err := js.Stream(t.Context(), "PLEG_crashloop")
		if err == nil {
			t.Logf("work stream: %+v %+v", ws.CachedInfo().State, ws.CachedInfo().Sources)
			for k := range 8 {
				c, err := ws.Consumer(t.Context(), fmt.Sprintf("crashloop-%d", k))
				if err == nil {
					ci := c.CachedInfo()
					t.Logf("consumer %d: pending %d ackpending %d redelivered %d waiting %d delivered %+v", k, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Delivered)
				}
			}
		}
		t.Fatal("no report within the timeout")
	}
	cancel()
	for range lines {
	}
	if err := <-done; err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
}

func TestRunRefusesABadFlag(t *testing.T) {
	t.Parallel()
	var stderr strings.Builder
	if err := run(t.Context(), []string{"-threshold", "many"}, io.Discard, &stderr); err == nil {
		t.Error("run with -threshold many = nil, want an error")
	}
	if !strings.Contains(stderr.String(), "-threshold") {
		t.Errorf("stderr %q does not name the flag", stderr.String())
	}
}

func TestHelpSaysWhatTheServiceDoes(t *testing.T) {
	t.Parallel()
	var stderr strings.Builder
	if err := run(t.Context(), []string{"-help"}, io.Discard, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -help = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"crash-loop", "ContainerDied", "sliding window", "-threshold", "-group", "demo"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("-help lacks %q:\n%s", want, stderr.String())
		}
	}
}

func TestReportCountsOneCrashInTheSingular(t *testing.T) {
	t.Parallel()
	r := Report{Namespace: "shop", Pod: "checkout-9ccmp", PodUID: "u", Container: "app", ExitCode: 1, Reason: "Error",
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Window: 10 * time.Minute, Sequence: 42}
	for n, want := range map[int]string{
		1: "2026-01-02T03:04:05Z CRASHLOOP shop/checkout-9ccmp (uid u) container app: 1 crash in 10m0s, last exit 1 Error (seq 42)",
		3: "2026-01-02T03:04:05Z CRASHLOOP shop/checkout-9ccmp (uid u) container app: 3 crashes in 10m0s, last exit 1 Error (seq 42)",
	} {
		r.Crashes = n
		if got := formatReport(r); got != want {
			t.Errorf("formatReport with %d crashes:\n got %s\nwant %s", n, got, want)
		}
	}
}
