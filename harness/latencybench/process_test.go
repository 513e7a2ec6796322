package latencybench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets a Harness re-execute the test binary as the simulated
// runtime's process, and the tests below start it as a fake one.
func TestMain(m *testing.M) {
	MaybeRunRuntimeProcess()
	if fake := os.Getenv(fakeRuntimeEnv); fake != "" {
		os.Exit(runFakeRuntime(fake))
	}
	os.Exit(m.Run())
}

// fakeRuntimeEnv makes the test binary a runtime's process that writes what
// it is told to and exits: its value is a fakeRuntime in JSON.
const fakeRuntimeEnv = "LATENCYBENCH_FAKE_RUNTIME"

type fakeRuntime struct {
	Stdout, Stderr string
	// WaitStdin makes it exit only once its stdin ends, as a real one does
	// when told to stop.
	WaitStdin bool
	Exit      int
}

func runFakeRuntime(spec string) int {
	var f fakeRuntime
	if err := json.Unmarshal([]byte(spec), &f); err != nil {
		fmt.Fprintln(os.Stderr, "fake runtime:", err)
		return 100
	}
	_, _ = os.Stdout.WriteString(f.Stdout)
	_, _ = os.Stderr.WriteString(f.Stderr)
	if f.WaitStdin {
		_, _ = io.Copy(io.Discard, os.Stdin)
	}
	return f.Exit
}

func fakeRuntimeEnviron(t *testing.T, f fakeRuntime) []string {
	t.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return append(os.Environ(), fakeRuntimeEnv+"="+string(b))
}

// Records as a runtime's process writes them.
const (
	listeningLine  = `{"kind":"listening"}` + "\n"
	transitionLine = `{"kind":"transition","container_id":"c1","event_type":"ContainerStarted","at":1,"measured":true}` + "\n"
	doneLine       = `{"kind":"done","rate":1000,"cpu":0.25}` + "\n"
)

func TestRuntimeProcessFailuresAreReported(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fake     fakeRuntime
		startErr bool // it fails to start, rather than while running
		want     []string
	}{
		{
			name:     "a process that ends before it listens is reported with its exit status and stderr",
			fake:     fakeRuntime{Stderr: "cannot listen\n", Exit: 4},
			startErr: true,
			want:     []string{"start the runtime process: it ended before it listened", "exit status 4", `stderr ending "cannot listen"`},
		},
		{
			name:     "garbage instead of listening is a malformed record",
			fake:     fakeRuntime{Stdout: "PASS\n", WaitStdin: true},
			startErr: true,
			want:     []string{`malformed record "PASS"`, "exit status 0"},
		},
		{
			name:     "a transition before listening is out of protocol",
			fake:     fakeRuntime{Stdout: transitionLine, WaitStdin: true},
			startErr: true,
			want:     []string{`a "transition" record first, want "listening"`},
		},
		{
			name: "a process that ends before its last transition is reported with its exit status and stderr",
			fake: fakeRuntime{Stdout: listeningLine + transitionLine, Stderr: "giving up\n", Exit: 3},
			want: []string{"ended before it reported its last transition", "exit status 3", `stderr ending "giving up"`},
		},
		{
			name: "garbage among the records is a malformed record",
			fake: fakeRuntime{Stdout: listeningLine + "{not json\n", WaitStdin: true},
			want: []string{"read the runtime process's records: malformed record \"{not json\"", "exit status 0"},
		},
		{
			name: "a transition of an unknown event type is a malformed record",
			fake: fakeRuntime{Stdout: listeningLine + strings.Replace(transitionLine, "ContainerStarted", "ContainerExploded", 1), WaitStdin: true},
			want: []string{`unknown Lifecycle event type "ContainerExploded"`},
		},
		{
			name: "a transition reported twice is refused",
			fake: fakeRuntime{Stdout: listeningLine + transitionLine + transitionLine, WaitStdin: true},
			want: []string{"ContainerStarted of container c1: transition reported twice"},
		},
		{
			name: "a process that fails after its last transition is reported",
			fake: fakeRuntime{Stdout: listeningLine + transitionLine + doneLine, Exit: 2},
			want: []string{"the runtime process failed (exit status 2)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			logger := slog.New(slog.DiscardHandler)
			p, err := startRuntimeProcess(t.Context(), fakeRuntimeEnviron(t, tt.fake), logger)
			if !tt.startErr {
				if err != nil {
					t.Fatalf("startRuntimeProcess: %v", err)
				}
				err = p.run(t.Context(), newTracker(0))
			}
			if err == nil {
				t.Fatalf("got no error, want one containing %q", tt.want)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestRuntimeProcessRunsUntilStopped(t *testing.T) {
	t.Parallel()
	env := fakeRuntimeEnviron(t, fakeRuntime{Stdout: listeningLine + transitionLine + doneLine, WaitStdin: true})
	p, err := startRuntimeProcess(t.Context(), env, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tr := newTracker(1)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- p.run(ctx, tr) }()
	got, err := p.drive(t.Context(), 10*time.Second)
	if err != nil {
		t.Fatalf("drive: %v", err)
	}
	if got.rate != 1000 || got.runtimeCPU != 0.25 {
		t.Errorf("drive = %+v, want the rate and cpu of the done record", got)
	}
	// It reported its last transition but serves on until told to stop.
	select {
	case err := <-ran:
		t.Fatalf("run returned %v before it was told to stop", err)
	default:
	}
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("run = %v, want nil", err)
		}
	case <-time.After(runtimeStopGrace + 5*time.Second):
		t.Fatal("run did not return once told to stop")
	}
	if r := tr.result(ModeEvented, got); r.Expected != 1 || r.Acked != 0 {
		t.Errorf("tracker: %d expected, %d acked; want the reported transition expected, not acked", r.Expected, r.Acked)
	}
}

func TestRuntimeProcessReportsTheChildsError(t *testing.T) {
	t.Parallel()
	env, err := runtimeProcessEnv(runtimeSpec{
		Socket: filepath.Join(t.TempDir(), "no-such-dir", "rt.sock"), Rate: 100, Duration: time.Second,
		Slots: 3, ContainersPerPod: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = startRuntimeProcess(t.Context(), env, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "exit status 1") || !strings.Contains(err.Error(), "pleg-bench runtime process: listen on") {
		t.Fatalf("startRuntimeProcess with a socket in a missing directory = %v, want its exit status and its listen error", err)
	}
}

// TestRuntimeProcessRole drives the runtime's process's role over pipes: it
// listens, makes its transitions after "go", reports each and the end, and
// returns once its stdin ends.
func TestRuntimeProcessRole(t *testing.T) {
	t.Parallel()
	spec, err := json.Marshal(runtimeSpec{
		Socket: filepath.Join(t.TempDir(), "rt.sock"), Rate: 200, Warmup: 50 * time.Millisecond,
		Duration: 100 * time.Millisecond, Slots: 6, ContainersPerPod: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	t.Cleanup(func() { stdinW.Close(); stdoutR.Close() })
	done := make(chan error, 1)
	go func() {
		err := runRuntimeProcess(t.Context(), string(spec), stdinR, stdoutW)
		stdoutW.CloseWithError(fmt.Errorf("runRuntimeProcess returned %v", err))
		done <- err
	}()

	records := bufio.NewScanner(stdoutR)
	next := func() runtimeRecord {
		t.Helper()
		if !records.Scan() {
			t.Fatalf("no record: %v", records.Err())
		}
		rec, err := parseRecord(records.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	if rec := next(); rec.Kind != recordListening {
		t.Fatalf("first record %+v, want listening", rec)
	}
	if _, err := io.WriteString(stdinW, goCommand+"\n"); err != nil {
		t.Fatal(err)
	}
	var measured, warmup int
	seen := map[transition]bool{}
	for rec := next(); rec.Kind != recordDone; rec = next() {
		tr := transition{rec.ContainerID, rec.EventType}
		if rec.Kind != recordTransition || seen[tr] {
			t.Fatalf("record %+v: want a new transition", rec)
		}
		seen[tr] = true
		if rec.Measured {
			measured++
		} else {
			warmup++
		}
	}
	if measured != 20 || warmup != 10 {
		t.Errorf("%d measured and %d warmup transitions, want 20 and 10", measured, warmup)
	}
	stdinW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runRuntimeProcess = %v after stdin closed, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runRuntimeProcess did not return after stdin closed")
	}
}

func TestRuntimeProcessRoleRefusesUnknownCommands(t *testing.T) {
	t.Parallel()
	spec, err := json.Marshal(runtimeSpec{
		Socket: filepath.Join(t.TempDir(), "rt.sock"), Rate: 200, Duration: time.Second, Slots: 3, ContainersPerPod: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	stdin := strings.NewReader("stop please\n")
	err = runRuntimeProcess(t.Context(), string(spec), stdin, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `unexpected command "stop please"`) {
		t.Fatalf("runRuntimeProcess = %v, want an error naming the command", err)
	}
}
