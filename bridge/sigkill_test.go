package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// sigkillChildEnv holds, JSON encoded, the sigkillChild a child process of
// TestSIGKILLAfterAnAckLosesNoTransition runs.
const sigkillChildEnv = "BRIDGE_SIGKILL_CHILD"

// sigkillChild is what the child process runs: a bridge over the parent's
// runtime and NATS server, with its durable state in DataDir.
type sigkillChild struct {
	Endpoint, URL, DataDir string
	Mode                   generator.Mode
}

// killDelays are the times from a container's ContainerStarted reaching the
// stream to the SIGKILL: across the checkpoint's 100 ms write interval and
// past it, where the ack may or may not be written.
var killDelays = []time.Duration{
	0, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
	30 * time.Millisecond, 45 * time.Millisecond, 60 * time.Millisecond, 75 * time.Millisecond,
	90 * time.Millisecond, 105 * time.Millisecond, 120 * time.Millisecond, 150 * time.Millisecond,
}

// TestSIGKILLAfterAnAckLosesNoTransition kills the bridge process with
// SIGKILL at many points between a ContainerStarted's ack and the
// checkpoint's next write, ends and removes the container while the bridge
// is down (with its pod, every other time), and restarts the bridge: every
// container and sandbox whose ContainerStarted is in the stream ends with
// exactly one ContainerDied and one ContainerRemoved, in order, and nothing
// is stored twice. The restarted bridge knows such a container only from
// the stream (the checkpoint had not written its ack), so this fails
// unless what the stream stored after the checkpoint is read back into the
// generator's state. Generic mode on containerd 2.4, and auto mode on
// containerd 1.7 (its own event service, no CRI event stream): neither has
// a runtime replay to hide the loss.
func TestSIGKILLAfterAnAckLosesNoTransition(t *testing.T) {
	if spec := os.Getenv(sigkillChildEnv); spec != "" {
		runSigkillChild(t, spec)
		return
	}
	for _, tc := range []struct {
		name    string
		runtime crisim.Options
		mode    generator.Mode
	}{
		{"generic mode on containerd 2.4", crisim.Containerd24Options(), generator.ModeGeneric},
		{"auto mode on containerd 1.7", crisim.Containerd17Options(), generator.ModeAuto},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testSIGKILLAfterAnAck(t, tc.runtime, tc.mode)
		})
	}
}

func testSIGKILLAfterAnAck(t *testing.T, rtOpts crisim.Options, mode generator.Mode) {
	// Removed containers are not reported as running by the runtime.
	rtOpts.ReplayWhileDisconnected = 0
	model := crisim.NewRuntime(rtOpts)
	_, endpoint := crisimtest.Serve(t, model)
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	spec, err := json.Marshal(sigkillChild{Endpoint: endpoint, URL: url, DataDir: t.TempDir(), Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "bridge.log")
	start := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestSIGKILLAfterAnAckLosesNoTransition$")
		cmd.Env = append(os.Environ(), sigkillChildEnv+"="+string(spec))
		log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	child := start()
	t.Cleanup(func() {
		if child != nil {
			child.Process.Kill()
			child.Wait()
		}
	})

	publishtest.WaitStream(t, js, "PLEG")
	stored := followStream(t, js)
	byContainer := map[string][]consumer.Event{}
	// waitFor reads the stream until cond holds of what it stored, or
	// for 20 s, and reports whether it holds.
	waitFor := func(cond func() bool) bool {
		deadline := time.After(20 * time.Second)
		for !cond() {
			select {
			case e := <-stored:
				byContainer[e.ContainerID] = append(byContainer[e.ContainerID], e)
			case <-deadline:
				return false
			}
		}
		return true
	}
	failWithLog := func(format string, args ...any) {
		t.Helper()
		data, _ := os.ReadFile(logPath)
		t.Fatalf(format+"\nbridge log:\n%s", append(args, lastLines(string(data), 60))...)
	}
	has := func(id, typ string) bool {
		for _, e := range byContainer[id] {
			if e.LifecycleType() == typ {
				return true
			}
		}
		return false
	}

	// readAll reads what the stream holds now.
	readAll := func() {
		t.Helper()
		info, err := js.Stream(t.Context(), "PLEG")
		if err != nil {
			t.Fatal(err)
		}
		last := info.CachedInfo().State.LastSeq
		if !waitFor(func() bool {
			n := 0
			for _, evs := range byContainer {
				n += len(evs)
			}
			return uint64(n) == last
		}) {
			failWithLog("the stream's %d messages were not all read", last)
		}
	}
	var ids, sandboxes []string
	// sandboxSeen says, for each pod whose sandbox is removed, whether its
	// ContainerStarted was stored before the kill. One whose event was
	// still in memory (written to the spool every 100 ms) is lost with the
	// process: no later bridge can know it existed, as for a pod that
	// lived and went while no bridge ran.
	sandboxSeen := map[string]bool{}
	for i, delay := range killDelays {
		sb, err := model.RunPodSandbox(crisim.PodConfig{Name: fmt.Sprintf("web-%d", i), Namespace: "shop", UID: fmt.Sprintf("uid-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		c, err := model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"})
		if err != nil {
			t.Fatal(err)
		}
		if err := model.StartContainer(c); err != nil {
			t.Fatal(err)
		}
		ids, sandboxes = append(ids, c), append(sandboxes, sb)
		if !waitFor(func() bool { return has(c, "ContainerStarted") }) {
			failWithLog("ContainerStarted of container %d (%s): not in the stream", i, c)
		}
		// The SIGKILL is scheduled delay after the ack was seen: the
		// fault's timing. What the test waits for is the process's end.
		proc := child.Process
		killErr := make(chan error, 1)
		time.AfterFunc(delay, func() { killErr <- proc.Kill() })
		if err := <-killErr; err != nil {
			t.Fatal(err)
		}
		child.Wait() // killed: its error says so
		readAll()
		if err := model.StopContainer(c, 3, "Error", ""); err != nil {
			t.Fatal(err)
		}
		if err := model.RemoveContainer(c); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 { // the whole pod goes too
			sandboxSeen[sb] = has(sb, "ContainerStarted")
			if err := model.StopPodSandbox(sb); err != nil {
				t.Fatal(err)
			}
			if err := model.RemovePodSandbox(sb); err != nil {
				t.Fatal(err)
			}
		}
		child = start()
		// The restarted bridge itself reports the rest, not a later one
		// that finds it in a checkpoint: what is missing then is reported
		// below.
		if !waitFor(func() bool { return has(c, "ContainerRemoved") && (!sandboxSeen[sb] || has(sb, "ContainerRemoved")) }) {
			t.Errorf("container %d (killed %v after its ack): the restarted bridge did not report its removal", i, delay)
		}
	}
	// A graceful stop: whatever it would still publish is in the stream
	// when it exits.
	if err := child.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("the bridge's graceful stop: %v", err)
	}
	child = nil
	readAll()

	unseen := 0
	for i, c := range ids {
		checkLifecycle(t, fmt.Sprintf("container %d (killed %v after its ack)", i, killDelays[i]), byContainer[c], true)
		sb := sandboxes[i]
		if seen, removed := sandboxSeen[sb]; removed && !seen {
			if len(byContainer[sb]) != 0 {
				t.Errorf("sandbox %d: its start was not stored before the kill, and it was gone at the restart, yet %d events are", i, len(byContainer[sb]))
			}
			unseen++
			continue
		}
		checkLifecycle(t, fmt.Sprintf("sandbox %d", i), byContainer[sb], i%2 == 1)
	}
	t.Logf("%d kills; %d removed sandboxes' starts were in memory only when the bridge was killed", len(ids), unseen)
	if t.Failed() {
		data, _ := os.ReadFile(logPath)
		t.Logf("bridge log:\n%s", lastLines(string(data), 60))
	}
}

// checkLifecycle checks that evs, a container's events in stream order,
// are Started, Died and Removed exactly once each, or Started alone if the
// container was not removed; a Died reports exit code 3 or, where the
// bridge found the container gone without seeing it exit, none.
func checkLifecycle(t *testing.T, what string, evs []consumer.Event, removed bool) {
	t.Helper()
	var types []string
	for _, e := range evs {
		types = append(types, e.LifecycleType())
		if e.LifecycleType() == "ContainerDied" && !e.Data.Container.Sandbox {
			if code := e.Data.ExitCode; code != nil && *code != 3 {
				t.Errorf("%s: ContainerDied with exit code %d, want 3 or unknown", what, *code)
			}
		}
	}
	want := "ContainerStarted"
	if removed {
		want = "ContainerStarted ContainerDied ContainerRemoved"
	}
	if got := strings.Join(types, " "); got != want {
		t.Errorf("%s: stored %q, want %q", what, got, want)
	}
}

// followStream reads the PLEG stream from its start with an ordered
// consumer and sends each decoded event on the channel it returns, until
// the test ends.
func followStream(t *testing.T, js jetstream.JetStream) <-chan consumer.Event {
	t.Helper()
	cons, err := js.OrderedConsumer(t.Context(), "PLEG", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan consumer.Event, 1024)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		e, err := consumer.DecodeMsg(m)
		if err != nil {
			t.Errorf("decode a stored message: %v", err)
			return
		}
		select {
		case out <- e:
		case <-t.Context().Done():
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// runSigkillChild runs the child's bridge until SIGTERM (a SIGKILL ends it
// where it is).
func runSigkillChild(t *testing.T, spec string) {
	var c sigkillChild
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	opts := testOptions(c.Endpoint, c.URL, c.DataDir)
	opts.Mode = c.Mode
	opts.Stream.DuplicateWindow = time.Second
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	b, err := bridge.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Run(ctx); err != nil {
		t.Fatal(err)
	}
}
