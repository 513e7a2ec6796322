package main

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// startSim serves a new simulated runtime with opts until the test ends.
func startSim(t *testing.T, opts crisim.Options) (*crisim.Runtime, *crisim.Server, string) {
	t.Helper()
	model := crisim.NewRuntime(opts)
	srv, endpoint := crisimtest.Serve(t, model)
	return model, srv, endpoint
}

// fetch reads n messages from the stream with a deadline and decodes them.
func fetch(t *testing.T, js jetstream.JetStream, n int) []consumer.Event {
	t.Helper()
	return fetchFrom(t, js, "PLEG", n)
}

// fetchFrom reads the first n messages of stream with a deadline, checks
// them against the contract and decodes them.
func fetchFrom(t *testing.T, js jetstream.JetStream, stream string, n int) []consumer.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	publishtest.WaitStream(t, js, stream)
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []consumer.Event
	for len(out) < n {
		msg, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d events: %v", len(out), n, err)
		}
		schemastest.ValidateCloudEvent(t, msg.Data())
		if msg.Headers().Get("Nats-Msg-Id") == "" {
			t.Errorf("message on %s has no Nats-Msg-Id", msg.Subject())
		}
		e, err := consumer.DecodeMsg(msg)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Headers().Get("Nats-Msg-Id") != e.ID {
			t.Errorf("Nats-Msg-Id %q != CloudEvent id %q", msg.Headers().Get("Nats-Msg-Id"), e.ID)
		}
		out = append(out, e)
	}
	return out
}

// envFrom returns a lookup over kv alone, never the process environment,
// with PLEG_DATA_DIR in a new temporary directory unless kv sets it.
func envFrom(t *testing.T, kv map[string]string) lookupFunc {
	t.Helper()
	env := map[string]string{"PLEG_DATA_DIR": t.TempDir()}
	maps.Copy(env, kv)
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

// TestRunEndToEnd runs the agent as main does, against the simulated
// runtime over gRPC and a real NATS server, configured only by PLEG_*
// variables.
func TestRunEndToEnd(t *testing.T) {
	t.Parallel()
	model, sim, endpoint := startSim(t, crisim.Options{})
	_, url := publishtest.NewServer(t)
	env := envFrom(t, map[string]string{
		"PLEG_NODE_NAME":      "node-1.example.com",
		"PLEG_CRI_ENDPOINT":   endpoint,
		"PLEG_NATS_URL":       url,
		"PLEG_MODE":           "generic",
		"PLEG_RELIST_PERIOD":  "100ms",
		"PLEG_LISTEN_ADDRESS": "",
		"PLEG_LOG_FORMAT":     "json",
	})
	_, js := publishtest.Connect(t, url)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr logtest.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"run"}, env, &bytes.Buffer{}, &stderr) }()

	// A pod whose UID is not a valid subject token.
	sb, err := model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "odd.uid*with>chars"})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"})
	if err := model.StartContainer(c); err != nil {
		t.Fatal(err)
	}
	fetch(t, js, 2) // started: sandbox and container
	if err := model.StopContainer(c, 42, "Error", ""); err != nil {
		t.Fatal(err)
	}
	fetch(t, js, 3) // seen exited by a relist before it is removed
	if err := model.RemoveContainer(c); err != nil {
		t.Fatal(err)
	}
	evs := fetch(t, js, 4)

	var got []string
	for _, e := range evs {
		got = append(got, e.LifecycleType()+" "+e.Subject)
		if e.Node != "node-1.example.com" || e.PodUID != "odd.uid*with>chars" {
			t.Errorf("event node %q pod %q", e.Node, e.PodUID)
		}
		if !strings.HasPrefix(e.NATSSubject, "pleg.node-1_example_com.shop.odd_uid%2Awith%3Echars.") {
			t.Errorf("subject %q does not carry the encoded node, namespace and pod", e.NATSSubject)
		}
	}
	want := []string{
		"ContainerStarted shop/web-0", "ContainerStarted shop/web-0/app",
		"ContainerDied shop/web-0/app", "ContainerRemoved shop/web-0/app",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if d := evs[2].Data; d.ExitCode == nil || *d.ExitCode != 42 || d.State != "exited" {
		t.Errorf("died data = %+v", d)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v; log:\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	if m := sim.MutatingCalls(); len(m) != 0 {
		t.Errorf("the bridge made mutating CRI calls: %v", m)
	}
	if !strings.Contains(stderr.String(), `"msg":"pleg-bridge stopped"`) {
		t.Errorf("JSON log lacks the stop record:\n%s", stderr.String())
	}
}

func TestRunRejectsBadConfigurationNamingTheVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"PLEG_MODE": "fast"}, []string{`PLEG_MODE="fast"`}},
		{map[string]string{"PLEG_RELIST_PERIOD": "soon"}, []string{`PLEG_RELIST_PERIOD="soon"`}},
		{map[string]string{"PLEG_SUBJECT_PREFIX": "pleg.*"}, []string{`PLEG_SUBJECT_PREFIX="pleg.*"`}},
		{map[string]string{"PLEG_CE_MODE": "xml", "PLEG_STREAM_REPLICAS": "0"}, []string{`PLEG_CE_MODE="xml"`, `PLEG_STREAM_REPLICAS="0"`}},
		{map[string]string{"PLEG_CRI_ENDPOINT": "tcp://1.2.3.4:5"}, []string{`PLEG_CRI_ENDPOINT="tcp://1.2.3.4:5"`}},
		{map[string]string{"PLEG_STREAM": "a.b"}, []string{`PLEG_STREAM="a.b"`}},
		{map[string]string{"PLEG_STREAM_DUPLICATE_WINDOW": "1ms"}, []string{`PLEG_STREAM_DUPLICATE_WINDOW="1ms"`}},
		{map[string]string{"PLEG_NATS_TOKEN_FILE": "/nonexistent/token"}, []string{`PLEG_NATS_TOKEN_FILE="/nonexistent/token"`, "no such file"}},
		{map[string]string{"PLEG_NATS_TOKEN": "s3cret", "PLEG_NATS_TOKEN_FILE": "/run/token"}, []string{`PLEG_NATS_TOKEN_FILE="/run/token"`, "not both"}},
	}
	for _, tt := range tests {
		err := run(t.Context(), []string{"run"}, envFrom(t, tt.env), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Errorf("%v: run accepted it", tt.env)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not name %s", tt.env, err, w)
			}
		}
	}
}

func TestHelpListsEveryVariableWithItsDefault(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, envFrom(t, nil), &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"PLEG_NODE_NAME", "PLEG_CRI_ENDPOINT", "PLEG_NATS_URL", "PLEG_DATA_DIR", "PLEG_SUBJECT_PREFIX",
		"PLEG_STREAM", "PLEG_STREAM_REPLICAS", "PLEG_STREAM_MAX_AGE", "PLEG_STREAM_DUPLICATE_WINDOW", "PLEG_STREAM_MANAGE",
		"PLEG_CE_MODE", "PLEG_CLUSTER_NAME", "PLEG_MODE", "PLEG_RELIST_PERIOD", "PLEG_RELIST_THRESHOLD",
		"PLEG_EVENTED_RELIST_PERIOD", "PLEG_LISTEN_ADDRESS", "PLEG_LOG_LEVEL", "PLEG_LOG_FORMAT", "PLEG_NATS_CREDS", "PLEG_NATS_TLS_CA"} {
		if !strings.Contains(out.String(), v) {
			t.Errorf("--help lacks %s", v)
		}
	}
	if !strings.Contains(out.String(), "PLEG_RELIST_PERIOD") || !strings.Contains(out.String(), "1s") {
		t.Errorf("--help lacks defaults:\n%s", out.String())
	}
}

func TestDemoShowsEventsAsASubscriberSeesThem(t *testing.T) {
	t.Parallel()
	out := &logtest.Buffer{}
	changed := out.Changed()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--rate", "4", "--lifetime", "500ms", "--nats-listen", "127.0.0.1:-1"},
			envFrom(t, nil), out, &bytes.Buffer{})
	}()
	want := []string{"ContainerStarted", "ContainerDied", "ContainerRemoved", "exit=", "(sandbox)",
		// Evented by default: the banner does not say it relists every 1s.
		"mode auto, relist every 30s under the event stream (every 1s while it fails)",
		// The workloads: crash loops with growing attempts, an OOMKilled
		// cache, a Job that completes, in namespaces other than demo.
		"shop/checkout-", "attempt=2", "payments/cache-0/redis     exit=137 OOMKilled", "batch/report-0-", "/run   exit=0 Completed"}
	deadline := time.After(30 * time.Second)
	for !containsAll(out.String(), want) {
		select {
		case <-changed:
		case err := <-done:
			t.Fatalf("demo ended early: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("demo output lacks some of %q after 30s:\n%s", want, out.String())
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("demo did not stop after cancel")
	}
	if !strings.Contains(out.String(), "received ") {
		t.Errorf("demo did not print its summary:\n%s", out.String())
	}
}

// TestDemoStopsQuietlyAfterItsDuration runs the demo with --duration: it
// ends on its own, with its summary, and the stop is not reported as a
// failure of the runtime calls in flight. Its tuning comes from the
// environment, and where NATS is does not: the demo runs its own.
func TestDemoStopsQuietlyAfterItsDuration(t *testing.T) {
	t.Parallel()
	var out, logs bytes.Buffer
	env := envFrom(t, map[string]string{
		"PLEG_MODE": "generic", "PLEG_RELIST_PERIOD": "200ms",
		"PLEG_NATS_URL": "nats://nats.example:4222", "PLEG_NATS_USER": "someone", "PLEG_DATA_DIR": "",
	})
	done := make(chan error, 1)
	go func() {
		done <- run(t.Context(), []string{"demo", "--duration", "2s", "--rate", "4", "--lifetime", "300ms", "--nats-listen", "127.0.0.1:-1", "--log-level", "warn"},
			env, &out, &logs)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("demo did not stop 30s after its 2s duration")
	}
	if !strings.Contains(out.String(), "received ") {
		t.Errorf("demo did not print its summary:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "mode generic, relist every 200ms") {
		t.Errorf("demo did not take PLEG_MODE and PLEG_RELIST_PERIOD from the environment:\n%s", out.String())
	}
	if logs.Len() > 0 {
		t.Errorf("demo logged warnings or errors while stopping:\n%s", logs.String())
	}
}

func containsAll(s string, subs []string) bool {
	for _, w := range subs {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// TestDemoNamesATakenPort: a taken --listen stops the demo before its
// banner, naming the flag; a taken --nats-listen is said in the banner,
// beside the URL the embedded server took instead.
func TestDemoNamesATakenPort(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()

	var out bytes.Buffer
	err = run(t.Context(), []string{"demo", "--listen", addr, "--nats-listen", "127.0.0.1:-1", "--duration", "1s"}, envFrom(t, nil), &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--listen "+addr) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("demo with --listen taken = %v, want an error naming --listen %s", err, addr)
	}
	if out.Len() > 0 {
		t.Errorf("demo with --listen taken printed before failing:\n%s", out.String())
	}

	out.Reset()
	if err := run(t.Context(), []string{"demo", "--nats-listen", addr, "--duration", "1s", "--workloads=false"}, envFrom(t, nil), &out, io.Discard); err != nil {
		t.Fatalf("demo with --nats-listen taken: %v", err)
	}
	if want := "(--nats-listen " + addr + ": "; !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "address already in use") {
		t.Errorf("the banner does not say that --nats-listen %s was taken:\n%s", addr, out.String())
	}
}
