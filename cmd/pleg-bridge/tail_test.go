package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// waitTimeout bounds every wait on the in-process server and on output.
const waitTimeout = 10 * time.Second

// Names the test stream uses, different from the defaults so the tests show
// that tail and replay read them from the environment.
const (
	testStream = "EVENTS"
	testPrefix = "acme.pleg"
)

// testEnv is an in-process JetStream server with the test stream, and the
// PLEG_ environment that points tail and replay at it.
type testEnv struct {
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	_, url := publishtest.NewServer(t)
	nc, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{Name: testStream, SubjectPrefix: testPrefix}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	return &testEnv{url: url, nc: nc, js: js}
}

func (e *testEnv) getenv(key string) string {
	return map[string]string{
		"PLEG_NATS_URL":       e.url,
		"PLEG_STREAM":         testStream,
		"PLEG_SUBJECT_PREFIX": testPrefix,
	}[key]
}

// lookup is getenv as run takes it.
func (e *testEnv) lookup(key string) (string, bool) { return lookupOf(e.getenv)(key) }

// lookupOf turns a getenv into a lookupFunc: a variable is set when it is
// not empty.
func lookupOf(getenv func(string) string) lookupFunc {
	return func(key string) (string, bool) {
		v := getenv(key)
		return v, v != ""
	}
}

// publish publishes the events of node with the bridge's encoder,
// alternating structured and binary mode.
func (e *testEnv) publish(t *testing.T, node string, evs ...generator.Event) {
	t.Helper()
	for i, ev := range evs {
		mode := publish.ModeStructured
		if i%2 == 1 {
			mode = publish.ModeBinary
		}
		enc, err := publish.NewEncoder(publish.EncoderOptions{Node: node, SubjectPrefix: testPrefix, Mode: mode})
		if err != nil {
			t.Fatalf("NewEncoder: %v", err)
		}
		msg, err := enc.Encode(ev)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		if _, err := e.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatalf("publish %s: %v", msg.Subject, err)
		}
	}
}

var day = time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)

// lifecycle returns a Lifecycle event of container c (empty: the sandbox)
// of the pod, at the time of day at.
func lifecycle(typ generator.LifecycleEventType, pod generator.Pod, c string, at time.Duration) generator.Event {
	ev := generator.Event{
		Type:       typ,
		Pod:        pod,
		Container:  generator.Container{ID: pod.UID + "-" + c, Name: c, Sandbox: c == ""},
		Time:       day.Add(at),
		DetectedBy: generator.SourceRelist,
		ObservedAt: day.Add(at + time.Second),
	}
	switch typ {
	case generator.ContainerStarted:
		ev.State = generator.StateRunning
	case generator.ContainerDied:
		code := int32(137)
		ev.State, ev.ExitCode, ev.Reason = generator.StateExited, &code, "OOMKilled"
	case generator.ContainerRemoved:
		ev.State = generator.StateRemoved
	}
	return ev
}

var (
	web = generator.Pod{UID: "aaaa-1111", Namespace: "default", Name: "web-0"}
	dns = generator.Pod{UID: "bbbb-2222", Namespace: "kube-system", Name: "dns-0"}
)

// seed publishes web's app on node-1 starting, dying and being removed, and
// dns's sandbox and container starting on node-2.example.com.
func (e *testEnv) seed(t *testing.T) {
	t.Helper()
	e.publish(t, "node-1",
		lifecycle(generator.ContainerStarted, web, "app", 3*time.Hour+4*time.Minute+5*time.Second),
		lifecycle(generator.ContainerDied, web, "app", 3*time.Hour+9*time.Minute+500*time.Millisecond))
	e.publish(t, "node-2.example.com",
		lifecycle(generator.ContainerStarted, dns, "", 3*time.Hour+5*time.Minute+250*time.Millisecond),
		lifecycle(generator.ContainerStarted, dns, "dns", 3*time.Hour+5*time.Minute+750*time.Millisecond))
	e.publish(t, "node-1",
		lifecycle(generator.ContainerRemoved, web, "app", 3*time.Hour+9*time.Minute+time.Second))
}

// The lines tail prints for what seed publishes, in stream order.
var (
	webStarted = "03:04:05.000 ContainerStarted  default/web-0/app                              node=node-1 via=relist"
	webDied    = "03:09:00.500 ContainerDied     default/web-0/app          exit=137 OOMKilled  node=node-1 via=relist"
	dnsSandbox = "03:05:00.250 ContainerStarted  kube-system/dns-0 (sandbox)                     node=node-2.example.com via=relist"
	dnsStarted = "03:05:00.750 ContainerStarted  kube-system/dns-0/dns                          node=node-2.example.com via=relist"
	webRemoved = "03:09:01.000 ContainerRemoved  default/web-0/app                              node=node-1 via=relist"
)

// lineWriter returns a writer whose complete lines arrive on the channel.
// The writer is closed by t.Cleanup.
func lineWriter(t *testing.T) (io.Writer, <-chan string) {
	t.Helper()
	r, w := io.Pipe()
	lines := make(chan string, 100) // more than any test prints
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { w.Close() })
	return w, lines
}

// readLines returns the next n lines, failing the test after waitTimeout.
func readLines(t *testing.T, lines <-chan string, n int) []string {
	t.Helper()
	var got []string
	timeout := time.After(waitTimeout)
	for len(got) < n {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("output ended after %d of %d lines: %q", len(got), n, got)
			}
			got = append(got, l)
		case <-timeout:
			t.Fatalf("got %d of %d lines within %s: %q", len(got), n, waitTimeout, got)
		}
	}
	return got
}

// tailRun is pleg-bridge tail running in a goroutine.
type tailRun struct {
	lines  <-chan string // stdout
	errs   <-chan string // stderr
	cancel context.CancelFunc
	done   chan struct{}
	err    error // run's result, set before done is closed
}

// startTail runs pleg-bridge tail with args until the test ends or stop is
// called.
func startTail(t *testing.T, env *testEnv, args ...string) *tailRun {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	stdout, lines := lineWriter(t)
	stderr, errs := lineWriter(t)
	r := &tailRun{lines: lines, errs: errs, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx, append([]string{"tail"}, args...), env.lookup, stdout, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// stop cancels tail and returns its result.
func (r *tailRun) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(waitTimeout):
		t.Fatalf("tail did not return within %s of cancel", waitTimeout)
		return nil
	}
}

func TestTailPrintsNewEventsUntilCanceled(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.publish(t, "node-1", lifecycle(generator.ContainerStarted, generator.Pod{UID: "old", Namespace: "default", Name: "old"}, "app", time.Hour))

	created, err := env.nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.CREATED." + testStream + ".>")
	if err != nil {
		t.Fatalf("subscribe to advisories: %v", err)
	}
	if err := env.nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	tail := startTail(t, env)
	if _, err := created.NextMsg(waitTimeout); err != nil {
		t.Fatalf("wait for tail's consumer: %v", err)
	}
	env.seed(t)

	want := []string{webStarted, webDied, dnsSandbox, dnsStarted, webRemoved}
	if diff := cmp.Diff(want, readLines(t, tail.lines, len(want))); diff != "" {
		t.Errorf("tail printed (-want +got):\n%s", diff)
	}
	if err := tail.stop(t); err != nil {
		t.Errorf("tail after cancel = %v, want nil", err)
	}
}

func TestTailFiltersFromTheBeginning(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{name: "--all prints everything stored, with the date", args: []string{"--all"}, want: dated(webStarted, webDied, dnsSandbox, dnsStarted, webRemoved)},
		{name: "--node selects a node whose name has dots", args: []string{"--all", "--node", "node-2.example.com"}, want: dated(dnsSandbox, dnsStarted)},
		{name: "--pod selects a pod by UID", args: []string{"--all", "--pod", "aaaa-1111"}, want: dated(webStarted, webDied, webRemoved)},
		{name: "--pod selects a pod by namespace/name", args: []string{"--all", "--pod", "kube-system/dns-0"}, want: dated(dnsSandbox, dnsStarted)},
		{name: "--namespace selects a namespace", args: []string{"--all", "--namespace", "default"}, want: dated(webStarted, webDied, webRemoved)},
		{name: "-n is --namespace", args: []string{"--all", "-n", "kube-system"}, want: dated(dnsSandbox, dnsStarted)},
		{name: "--container selects containers by name, not sandboxes", args: []string{"--all", "--container", "dns"}, want: dated(dnsStarted)},
		{name: "--type selects a type", args: []string{"--all", "--type", "ContainerDied"}, want: dated(webDied)},
		{name: "--type takes a short form", args: []string{"--all", "--type", "removed"}, want: dated(webRemoved)},
		{name: "--type ignores case", args: []string{"--all", "--type", "STARTED", "--node", "node-1"}, want: dated(webStarted)},
		{name: "--pod namespace/name and --type combine", args: []string{"--all", "--pod", "default/web-0", "--type", "died"}, want: dated(webDied)},
		{name: "--since an hour ago prints everything stored", args: []string{"--since", "1h"}, want: dated(webStarted, webDied, dnsSandbox, dnsStarted, webRemoved)},
		{name: "--from-seq starts at a stream sequence", args: []string{"--from-seq", "4"}, want: dated(dnsStarted, webRemoved)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tail := startTail(t, env, tt.args...)
			got := readLines(t, tail.lines, len(tt.want))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("tail %s printed (-want +got):\n%s", strings.Join(tt.args, " "), diff)
			}
			if err := tail.stop(t); err != nil {
				t.Errorf("tail after cancel = %v, want nil", err)
			}
		})
	}
}

// TestTailSinceKeepsFollowing starts in the past and goes on printing
// events published after it caught up.
func TestTailSinceKeepsFollowing(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	tail := startTail(t, env, "--since", "1h", "--node", "node-1")
	want := dated(webStarted, webDied, webRemoved)
	if diff := cmp.Diff(want, readLines(t, tail.lines, len(want))); diff != "" {
		t.Errorf("tail --since printed the history (-want +got):\n%s", diff)
	}
	later := generator.Pod{UID: "cccc-3333", Namespace: "default", Name: "web-1"}
	env.publish(t, "node-1", lifecycle(generator.ContainerStarted, later, "app", 4*time.Hour))
	want = dated("04:00:00.000 ContainerStarted  default/web-1/app                              node=node-1 via=relist")
	if diff := cmp.Diff(want, readLines(t, tail.lines, 1)); diff != "" {
		t.Errorf("tail --since printed after catching up (-want +got):\n%s", diff)
	}
	if err := tail.stop(t); err != nil {
		t.Errorf("tail after cancel = %v, want nil", err)
	}
}

// TestTailSaysWhatItFollows checks stderr: what tail follows when it
// starts, and where it stopped when it ends.
func TestTailSaysWhatItFollows(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "everything from now", want: "pleg-bridge tail: following every event in stream EVENTS on " + env.url + ", from now (Ctrl-C stops)"},
		{
			name: "filters from the beginning",
			args: []string{"--all", "--pod", "default/web-0", "--type", "died"},
			want: "pleg-bridge tail: following events of pod default/web-0, type ContainerDied in stream EVENTS on " + env.url + ", from the beginning of the stream (Ctrl-C stops)",
		},
		{
			name: "a node, a pod UID, a namespace and a container from a time",
			args: []string{"--since", "2026-01-02T03:00:00Z", "--node", "node-1", "--pod", "aaaa-1111", "-n", "default", "-c", "app"},
			want: "pleg-bridge tail: following events of node node-1, pod UID aaaa-1111, namespace default, container app in stream EVENTS on " + env.url + ", from 2026-01-02T03:00:00Z (Ctrl-C stops)",
		},
		{
			name: "from a sequence",
			args: []string{"--from-seq", "3", "--type", "removed"},
			want: "pleg-bridge tail: following events of type ContainerRemoved in stream EVENTS on " + env.url + ", from stream sequence 3 (Ctrl-C stops)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tail := startTail(t, env, tt.args...)
			if diff := cmp.Diff([]string{tt.want}, readLines(t, tail.errs, 1)); diff != "" {
				t.Errorf("tail %s said on stderr (-want +got):\n%s", strings.Join(tt.args, " "), diff)
			}
		})
	}

	t.Run("that no stored event matched", func(t *testing.T) {
		t.Parallel()
		tail := startTail(t, env, "--all", "--pod", "default/web-1")
		want := []string{
			"pleg-bridge tail: following events of pod default/web-1 in stream EVENTS on " + env.url + ", from the beginning of the stream (Ctrl-C stops)",
			"pleg-bridge tail: no stored events matched; waiting for new ones",
		}
		if diff := cmp.Diff(want, readLines(t, tail.errs, len(want))); diff != "" {
			t.Errorf("tail said on stderr (-want +got):\n%s", diff)
		}
		// It goes on following: the pod's first event still arrives.
		env.publish(t, "node-1", lifecycle(generator.ContainerStarted, generator.Pod{UID: "dddd-4444", Namespace: "default", Name: "web-1"}, "app", 5*time.Hour))
		want = dated("05:00:00.000 ContainerStarted  default/web-1/app                              node=node-1 via=relist")
		if diff := cmp.Diff(want, readLines(t, tail.lines, 1)); diff != "" {
			t.Errorf("tail printed (-want +got):\n%s", diff)
		}
	})

	t.Run("where it stopped", func(t *testing.T) {
		t.Parallel()
		tail := startTail(t, env, "--all", "--pod", "default/web-0", "--type", "died")
		readLines(t, tail.errs, 1)
		if diff := cmp.Diff(dated(webDied), readLines(t, tail.lines, 1)); diff != "" {
			t.Errorf("tail printed (-want +got):\n%s", diff)
		}
		if err := tail.stop(t); err != nil {
			t.Errorf("tail after cancel = %v, want nil", err)
		}
		// The server sends web-0's ContainerDied (sequence 2) only: the
		// pod's name is checked on each event after the server's filter.
		want := "pleg-bridge tail: stopped after stream sequence 2; --from-seq 3 continues from there"
		if diff := cmp.Diff([]string{want}, readLines(t, tail.errs, 1)); diff != "" {
			t.Errorf("tail said when it stopped (-want +got):\n%s", diff)
		}
	})
}

func TestTailJSONPrintsCloudEvents(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	tail := startTail(t, env, "--all", "--json", "--type", "ContainerDied")
	got := readLines(t, tail.lines, 1)[0]
	for _, want := range []string{`"specversion":"1.0"`, `"type":"pleg.v1.ContainerDied"`, `"poduid":"aaaa-1111"`, `"exitCode":137`} {
		if !strings.Contains(got, want) {
			t.Errorf("tail --json printed %s, want it to contain %s", got, want)
		}
	}
	if err := tail.stop(t); err != nil {
		t.Errorf("tail after cancel = %v, want nil", err)
	}
}

// failingWriter fails every write with err.
type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

// consumers returns how many consumers the test stream has.
func (e *testEnv) consumers(t *testing.T) int {
	t.Helper()
	stream, err := e.js.Stream(t.Context(), testStream)
	if err != nil {
		t.Fatalf("look up stream: %v", err)
	}
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Consumers
}

// TestClosedStdoutEndsTheCommandAndDeletesItsConsumer is pleg-bridge tail |
// head, and replay's equivalent: the first write to stdout fails. The
// command ends, quietly if the reader went away (EPIPE), with the error
// otherwise, and leaves no consumer on the stream.
func TestClosedStdoutEndsTheCommandAndDeletesItsConsumer(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	brokenPipe := &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}
	diskFull := &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.ENOSPC}
	tests := []struct {
		name    string
		args    []string
		err     error
		wantErr string // "": nil
	}{
		{name: "tail ends quietly on a broken pipe", args: []string{"tail", "--all"}, err: brokenPipe},
		{name: "tail reports another write error", args: []string{"tail", "--all"}, err: diskFull, wantErr: "write to stdout"},
		{name: "tail --json ends quietly on a broken pipe", args: []string{"tail", "--since", "1h", "--json"}, err: brokenPipe},
		{name: "replay ends quietly on a broken pipe", args: []string{"replay", "--since", "1h"}, err: brokenPipe},
		{name: "replay reports another write error", args: []string{"replay", "--pod", "default/web-0"}, err: diskFull, wantErr: "no space left"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Not parallel: the subtests count the consumers of one stream.
			ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
			defer cancel()
			err := run(ctx, tt.args, env.lookup, failingWriter{tt.err}, io.Discard)
			if ctx.Err() != nil {
				t.Fatalf("%s did not end within %s of a failed write", strings.Join(tt.args, " "), waitTimeout)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("%s = %v, want nil", strings.Join(tt.args, " "), err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("%s = %v, want an error containing %q", strings.Join(tt.args, " "), err, tt.wantErr)
			}
			if n := env.consumers(t); n != 0 {
				t.Errorf("%s left %d consumers on the stream, want 0", strings.Join(tt.args, " "), n)
			}
		})
	}
}

func TestTailRefusesBadFlags(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	tests := []struct {
		name      string
		args      []string
		getenv    func(string) string
		wantErr   string
		wantUsage bool // a *cli.UsageError: exit status 2
	}{
		{name: "an unknown flag is named", args: []string{"--bogus"}, wantErr: "bogus", wantUsage: true},
		{name: "a bad --since is named", args: []string{"--since", "last tuesday"}, wantErr: "since", wantUsage: true},
		{name: "a negative --since is named", args: []string{"--since", "-5m"}, wantErr: "since", wantUsage: true},
		{name: "a bad --from-seq is named", args: []string{"--from-seq", "-1"}, wantErr: "from-seq", wantUsage: true},
		{name: "an unknown --type is named", args: []string{"--type", "ContainerChanged"}, wantErr: "--type", wantUsage: true},
		{name: "a bad --prefix is named", args: []string{"--prefix", "pleg.>"}, wantErr: "--prefix", wantUsage: true},
		{name: "a --pod with an empty name is named", args: []string{"--pod", "default/"}, wantErr: "--pod", wantUsage: true},
		{name: "a --pod outside --namespace is refused", args: []string{"--pod", "default/web-0", "-n", "kube-system"}, wantErr: "--namespace", wantUsage: true},
		{name: "a bad --color is named", args: []string{"--color", "sometimes"}, wantErr: "--color", wantUsage: true},
		{name: "--all and --since together are refused", args: []string{"--all", "--since", "1h"}, wantErr: "--all and --since", wantUsage: true},
		{name: "--since and --from-seq together are refused", args: []string{"--since", "1h", "--from-seq", "3"}, wantErr: "--since and --from-seq", wantUsage: true},
		{name: "a positional argument is refused", args: []string{"pod"}, wantErr: `unexpected argument "pod"`, wantUsage: true},
		{name: "an unreachable server is named by its URL", args: []string{"--nats-url", "nats://127.0.0.1:1"}, wantErr: "nats://127.0.0.1:1"},
		{
			name:    "the URL from the environment is named without its password",
			getenv:  func(k string) string { return map[string]string{"PLEG_NATS_URL": "nats://u:secret@127.0.0.1:1"}[k] },
			wantErr: "nats://u:xxxxx@127.0.0.1:1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			getenv := tt.getenv
			if getenv == nil {
				getenv = env.getenv
			}
			var stdout, stderr strings.Builder
			err := run(t.Context(), append([]string{"tail"}, tt.args...), lookupOf(getenv), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("tail %s = %v, want an error containing %q", strings.Join(tt.args, " "), err, tt.wantErr)
			}
			var ue *cli.UsageError
			if errors.As(err, &ue) != tt.wantUsage {
				t.Errorf("tail %s = %#v, want a usage error: %v", strings.Join(tt.args, " "), err, tt.wantUsage)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("tail error %q shows the password", err)
			}
			if stdout.Len() > 0 {
				t.Errorf("tail printed %q on stdout, want nothing", stdout.String())
			}
		})
	}
}

// TestTailHintsAtAPodOrNodeTheStateBucketDoesNotKnow is tail --pod
// demo/nope: one line on stderr says the state bucket knows no such pod,
// and tail follows anyway, printing the pod's events if it comes. A pod or
// node the bucket knows gets no hint.
func TestTailHintsAtAPodOrNodeTheStateBucketDoesNotKnow(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	state := startStateWriters(t, env.url, env.js)
	state.seed(t) // default/web-0 and default/job-1 on node-1, kube-system/dns-0 on node-2.example.com
	nope := generator.Pod{UID: "dddd-4444", Namespace: "demo", Name: "nope"}
	tests := []struct {
		name string
		args []string
		hint string
		node string        // where the event tail then prints comes from
		pod  generator.Pod // and its pod
	}{
		{
			name: "an unknown pod by name is hinted at",
			args: []string{"--pod", "demo/nope"},
			hint: "pleg-bridge tail: no container of pod demo/nope is known now (state bucket STATE); following anyway",
			node: "node-1", pod: nope,
		},
		{
			name: "an unknown node is hinted at",
			args: []string{"--node", "wrong-node"},
			hint: "pleg-bridge tail: no container of node wrong-node is known now (state bucket STATE); following anyway",
			node: "wrong-node", pod: web,
		},
		{
			name: "a pod name taken as a UID is hinted at with the way to name a pod",
			args: []string{"--pod", "web-0"},
			hint: "pleg-bridge tail: no container of pod UID web-0 is known now (state bucket STATE); " +
				"--pod web-0 is taken as a pod UID, a pod by name is --pod <namespace>/web-0; following anyway",
			node: "node-1", pod: generator.Pod{UID: "web-0", Namespace: "default", Name: "web-0"},
		},
		{
			name: "an unknown pod of a known node is hinted at with both",
			args: []string{"--node", "node-1", "--pod", "kube-system/dns-0"},
			hint: "pleg-bridge tail: no container of node node-1, pod kube-system/dns-0 is known now (state bucket STATE); following anyway",
			node: "node-1", pod: dns,
		},
		{name: "a known pod is not", args: []string{"--pod", "default/web-0"}, node: "node-1", pod: web},
		{name: "a known node is not", args: []string{"--node", "node-2.example.com"}, node: "node-2.example.com", pod: dns},
		{name: "a known namespace is not", args: []string{"-n", "kube-system"}, node: "node-2.example.com", pod: dns},
		{name: "no filter is not", node: "node-1", pod: web},
	}
	for i, tt := range tests {
		// One at a time: each prints the event the next one publishes.
		t.Run(tt.name, func(t *testing.T) {
			tail := startTail(t, env, append([]string{"--bucket", state.bucket}, tt.args...)...)
			if got := readLines(t, tail.errs, 1)[0]; !strings.HasPrefix(got, "pleg-bridge tail: following ") {
				t.Fatalf("tail's first line on stderr = %q, want it to say what it follows", got)
			}
			if tt.hint != "" {
				if diff := cmp.Diff(tt.hint, readLines(t, tail.errs, 1)[0]); diff != "" {
					t.Errorf("hint (-want +got):\n%s", diff)
				}
			}
			// It follows anyway: the pod's next event is printed. Each case
			// starts its own container: the stream stores an event of a
			// container once.
			container := fmt.Sprintf("app-%d", i)
			env.publish(t, tt.node, lifecycle(generator.ContainerStarted, tt.pod, container, time.Hour))
			if got := readLines(t, tail.lines, 1)[0]; !strings.Contains(got, tt.pod.Namespace+"/"+tt.pod.Name+"/"+container) {
				t.Errorf("tail printed %q, want the event of %s/%s", got, tt.pod.Namespace, tt.pod.Name)
			}
			if err := tail.stop(t); err != nil {
				t.Errorf("tail after cancel = %v, want nil", err)
			}
			// What follows the hint, or its absence, is where tail stopped.
			if got := readLines(t, tail.errs, 1)[0]; !strings.HasPrefix(got, "pleg-bridge tail: stopped after stream sequence") {
				t.Errorf("tail's next line on stderr = %q, want where it stopped", got)
			}
		})
	}
}

// TestTailOfAMissingStreamFailsBeforeFollowing is tail --stream NOPE: the
// error names the stream and the flag, and tail never said it follows.
func TestTailOfAMissingStreamFailsBeforeFollowing(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	for _, cmd := range []string{"tail", "replay"} {
		var stderr strings.Builder
		err := run(t.Context(), []string{cmd, "--stream", "NOPE", "--node", "node-1"}, env.lookup, io.Discard, &stderr)
		want := "stream NOPE not found on " + env.url + " (--stream; the bridges publish to PLEG_STREAM)"
		if err == nil || err.Error() != want {
			t.Errorf("%s --stream NOPE = %v, want %q", cmd, err, want)
		}
		if stderr.Len() > 0 {
			t.Errorf("%s --stream NOPE said on stderr %q before failing, want nothing", cmd, stderr.String())
		}
	}
}

// TestAMissingStreamsErrorHidesTheURLsToken: a token in --nats-url (NATS
// takes a user without a password for one) is not printed with the
// stream's error.
func TestAMissingStreamsErrorHidesTheURLsToken(t *testing.T) {
	t.Parallel()
	s := startAuthServer(t, &server.Options{Authorization: "s3cr3t-t0ken"})
	url := strings.Replace(s.ClientURL(), "nats://", "nats://s3cr3t-t0ken@", 1)
	err := run(t.Context(), []string{"replay", "--nats-url", url, "--stream", "NOPE", "--node", "node-1"},
		func(string) (string, bool) { return "", false }, io.Discard, io.Discard)
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "nats://xxxxx@") {
		t.Errorf("replay --stream NOPE with a token in the URL = %v, want the error with the token hidden (nats://xxxxx@...)", err)
	}
}

// TestTailPrintsAnEventTheStreamHoldsAgainOnce checks that an event tail
// printed, which its bridge published again after the servers lost it
// (the same CloudEvent, stored after the stream forgot its id), is not
// printed again, that stderr names the repeat, and that --from-seq
// continues after it.
func TestTailPrintsAnEventTheStreamHoldsAgainOnce(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	nc, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{Name: testStream, SubjectPrefix: testPrefix, DuplicateWindow: 100 * time.Millisecond}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	env := &testEnv{url: url, nc: nc, js: js}
	died := lifecycle(generator.ContainerDied, web, "app", 3*time.Hour+9*time.Minute+500*time.Millisecond)
	env.publish(t, "node-1", lifecycle(generator.ContainerStarted, web, "app", 3*time.Hour+4*time.Minute+5*time.Second))
	env.publish(t, "node-1", died)

	tail := startTail(t, env, "--all", "--pod", "default/web-0")
	if diff := cmp.Diff(dated(webStarted, webDied), readLines(t, tail.lines, 2)); diff != "" {
		t.Fatalf("tail printed (-want +got):\n%s", diff)
	}
	publishtest.WaitOutDuplicateWindow(t, js, testStream)
	env.publish(t, "node-1", died)
	s, err := js.Stream(t.Context(), testStream)
	if err != nil {
		t.Fatalf("look up stream: %v", err)
	}
	repeat := s.CachedInfo().State.LastSeq
	skipped := fmt.Sprintf("pleg-bridge tail: skipped ContainerDied default/web-0/app at stream sequence %d, a repeat of sequence 2 (published again by its bridge after the NATS servers lost it)", repeat)
	for l := readLines(t, tail.errs, 1)[0]; l != skipped; l = readLines(t, tail.errs, 1)[0] {
		if strings.Contains(l, "skipped") {
			t.Fatalf("tail said %q, want %q", l, skipped)
		}
	}
	if err := tail.stop(t); err != nil {
		t.Errorf("tail after cancel = %v, want nil", err)
	}
	stopped := fmt.Sprintf("pleg-bridge tail: stopped after stream sequence %d; --from-seq %d continues from there", repeat, repeat+1)
	if diff := cmp.Diff([]string{stopped}, readLines(t, tail.errs, 1)); diff != "" {
		t.Errorf("tail's last words (-want +got):\n%s", diff)
	}
	select {
	case l := <-tail.lines:
		t.Errorf("tail printed %q after the repeat", l)
	default:
	}
}
