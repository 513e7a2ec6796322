package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
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

// tailRun is runTail running in a goroutine.
type tailRun struct {
	lines  <-chan string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // runTail's result, set before done is closed
}

// startTail runs runTail with args until the test ends or stop is called.
func startTail(t *testing.T, env *testEnv, args ...string) *tailRun {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	stdout, lines := lineWriter(t)
	r := &tailRun{lines: lines, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = runTail(ctx, args, env.getenv, stdout, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// stop cancels runTail and returns its result.
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
		{name: "--all prints everything stored", args: []string{"--all"}, want: []string{webStarted, webDied, dnsSandbox, dnsStarted, webRemoved}},
		{name: "--node selects a node whose name has dots", args: []string{"--all", "--node", "node-2.example.com"}, want: []string{dnsSandbox, dnsStarted}},
		{name: "--pod selects a pod", args: []string{"--all", "--pod", "aaaa-1111"}, want: []string{webStarted, webDied, webRemoved}},
		{name: "--type selects a type", args: []string{"--all", "--type", "ContainerDied"}, want: []string{webDied}},
		{name: "--since an hour ago prints everything stored", args: []string{"--since", "1h"}, want: []string{webStarted, webDied, dnsSandbox, dnsStarted, webRemoved}},
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

func TestTailRefusesBadFlags(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	tests := []struct {
		name    string
		args    []string
		getenv  func(string) string
		wantErr string
	}{
		{name: "an unknown flag is named", args: []string{"--bogus"}, wantErr: "bogus"},
		{name: "a bad --since is named", args: []string{"--since", "last tuesday"}, wantErr: "since"},
		{name: "a negative --since is named", args: []string{"--since", "-5m"}, wantErr: "since"},
		{name: "an unknown --type is named", args: []string{"--type", "ContainerChanged"}, wantErr: "--type"},
		{name: "a bad --prefix is named", args: []string{"--prefix", "pleg.>"}, wantErr: "--prefix"},
		{name: "--all and --since together are refused", args: []string{"--all", "--since", "1h"}, wantErr: "--all and --since"},
		{name: "a positional argument is refused", args: []string{"pod"}, wantErr: `unexpected argument "pod"`},
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
			err := runTail(t.Context(), tt.args, getenv, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("tail %s = %v, want an error containing %q", strings.Join(tt.args, " "), err, tt.wantErr)
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
