package bridge_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// testOptions are the options of a bridge over the runtime at endpoint and
// the NATS server at url, relisting every 100ms in generic mode, with its
// durable state in dataDir.
func testOptions(endpoint, url, dataDir string) bridge.Options {
	return bridge.Options{
		Node:         "node-1",
		CRIEndpoint:  endpoint,
		Mode:         generator.ModeGeneric,
		RelistPeriod: 100 * time.Millisecond,
		NATS:         bridge.NATSOptions{URL: url},
		Stream:       bridge.StreamOptions{Manage: true},
		DataDir:      dataDir,
		Logger:       slog.New(slog.DiscardHandler),
	}
}

// testNode is a simulated runtime served on a unix socket and a NATS
// server, both until the test ends.
type testNode struct {
	model    *crisim.Runtime
	endpoint string
	url      string
	js       jetstream.JetStream
}

func newTestNode(t *testing.T) *testNode {
	t.Helper()
	n := &testNode{model: crisim.NewRuntime(crisim.Options{})}
	_, n.endpoint = crisimtest.Serve(t, n.model)
	_, n.url = publishtest.NewServer(t)
	_, n.js = publishtest.Connect(t, n.url)
	return n
}

// startPod runs the pod shop/web-0 with a running container of each name,
// and returns its sandbox and container IDs.
func (n *testNode) startPod(t *testing.T, names ...string) (string, []string) {
	t.Helper()
	sb, err := n.model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, name := range names {
		ids = append(ids, n.startContainer(t, sb, name))
	}
	return sb, ids
}

// startContainer creates and starts a container in the sandbox sb.
func (n *testNode) startContainer(t *testing.T, sb, name string) string {
	t.Helper()
	c, err := n.model.CreateContainer(sb, crisim.ContainerConfig{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.model.StartContainer(c); err != nil {
		t.Fatal(err)
	}
	return c
}

// runBridge runs a bridge with opts until the returned stop is called, which
// waits for Run and fails the test if it returned an error.
func runBridge(t *testing.T, opts bridge.Options) (b *bridge.Bridge, stop func()) {
	t.Helper()
	b, err := bridge.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	var once sync.Once
	stop = func() {
		t.Helper()
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return 30s after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return b, stop
}

// fetchAll reads the first n messages of stream, checks each against the
// contract and returns them as "<type> <subject>" lines.
func fetchAll(t *testing.T, js jetstream.JetStream, stream string, n int) []string {
	t.Helper()
	publishtest.WaitStream(t, js, stream)
	cons, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for len(out) < n {
		msg, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d events: %v (got %q)", len(out), n, err, out)
		}
		schemastest.ValidateCloudEvent(t, msg.Data())
		e, err := consumer.DecodeMsg(msg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e.LifecycleType()+" "+e.Subject)
	}
	return out
}

func checkLines(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRunReturnsTheListenErrorLeavingNothingRunning binds the port first:
// Run returns the listen error, and no goroutine it started is left.
func TestRunReturnsTheListenErrorLeavingNothingRunning(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	opts := testOptions("unix:///nonexistent/cri.sock", "", t.TempDir())
	opts.ListenAddress = taken.Addr().String()
	b, err := bridge.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Run(t.Context())
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), taken.Addr().String()) {
		t.Fatalf("Run = %v, want the listen error naming %s", err, taken.Addr())
	}
}

// TestRunThatCannotOpenItsStoreClosesWhatItOpened holds the durable store
// the bridge wants: Run fails at once, closes the listener it bound and
// leaves no goroutine behind.
func TestRunThatCannotOpenItsStoreClosesWhatItOpened(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	held, err := datadir.Open(dir, datadir.Options{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	opts := testOptions("unix:///nonexistent/cri.sock", "nats://127.0.0.1:1", dir)
	opts.ListenAddress = "127.0.0.1:0"
	b, err := bridge.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := b.Run(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("Run with its store held elsewhere = %v, want an error at once", err)
	}
	if st := b.Status(); st.Built {
		t.Errorf("Status after a failed start = %+v, want nothing built", st)
	}
}

func TestNewNamesTheOptionsAtFault(t *testing.T) {
	t.Parallel()
	_, err := bridge.New(bridge.Options{SpoolMaxBytes: -1, NATS: bridge.NATSOptions{Token: "a", TokenFile: "b"}})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"node name is empty", "CRI endpoint is empty", "no NATS URL and no data directory", "spool max bytes -1", "token and token file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestHooksSeeTheProductionPipeline wraps the runtime and the sink and
// observes the acks: each sees the events the stream receives.
func TestHooksSeeTheProductionPipeline(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	n.startPod(t, "app")

	var mu sync.Mutex
	var listed, sent, acked []string // guarded by mu
	acks := make(chan struct{}, 16)
	opts := testOptions(n.endpoint, n.url, t.TempDir())
	opts.Hooks = bridge.Hooks{
		WrapRuntime: func(rt generator.Runtime) generator.Runtime { return listingRuntime{rt, &mu, &listed} },
		WrapSink:    func(s generator.Sink) generator.Sink { return recordingSink{s, &mu, &sent} },
		OnAck: func(ev generator.Event) {
			mu.Lock()
			acked = append(acked, string(ev.Type)+" "+ev.Pod.Name+"/"+ev.Container.Name)
			mu.Unlock()
			acks <- struct{}{}
		},
	}
	b, stop := runBridge(t, opts)
	got := fetchAll(t, n.js, "PLEG", 2)
	checkLines(t, got, []string{"ContainerStarted shop/web-0", "ContainerStarted shop/web-0/app"})
	for range 2 {
		select {
		case <-acks:
		case <-time.After(20 * time.Second):
			t.Fatal("OnAck not called for each event in the stream")
		}
	}
	if st := b.Status(); !st.Built || !st.Synced || st.Mode != generator.ModeGeneric || st.Pending != 0 {
		t.Errorf("Status = %+v, want built, synced, generic, nothing pending", st)
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(listed) == 0 {
		t.Error("the wrapped runtime was not used")
	}
	want := "ContainerStarted web-0/,ContainerStarted web-0/app" // the sandbox has no container name
	if strings.Join(sent, ",") != want || strings.Join(acked, ",") != want {
		t.Errorf("sink saw %q, OnAck saw %q, want %q", sent, acked, want)
	}
}

type listingRuntime struct {
	generator.Runtime
	mu     *sync.Mutex
	listed *[]string
}

func (r listingRuntime) ListContainers(ctx context.Context, f *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	r.mu.Lock()
	*r.listed = append(*r.listed, "ListContainers")
	r.mu.Unlock()
	return r.Runtime.ListContainers(ctx, f)
}

type recordingSink struct {
	generator.Sink
	mu   *sync.Mutex
	sent *[]string
}

func (s recordingSink) Send(ctx context.Context, events []generator.Event) error {
	s.mu.Lock()
	for _, ev := range events {
		*s.sent = append(*s.sent, string(ev.Type)+" "+ev.Pod.Name+"/"+ev.Container.Name)
	}
	s.mu.Unlock()
	return s.Sink.Send(ctx, events)
}

// TestRestartFromTheCheckpointNeitherRepublishesNorForgets stops the bridge,
// changes the node, and starts a new bridge over the same data directory
// and stream: it publishes what changed and nothing it had published
// before, and warns of nothing. Each restart comes after the stream's
// duplicate window, so that JetStream's deduplication cannot hide a
// re-publication.
func TestRestartFromTheCheckpointNeitherRepublishesNorForgets(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	dir := t.TempDir()
	logs := &logtest.Buffer{}
	opts := testOptions(n.endpoint, n.url, dir)
	opts.Stream.DuplicateWindow = 100 * time.Millisecond // the shortest JetStream takes
	opts.Logger = logs.JSONLogger(slog.LevelInfo)
	sb, ids := n.startPod(t, "keep", "gone")
	var stored []string // what the stream holds, in order
	// runOnce runs a bridge until the stream holds want more events, stops
	// it, and returns those events.
	runOnce := func(want int) []string {
		t.Helper()
		b, stop := runBridge(t, opts)
		got := fetchAll(t, n.js, "PLEG", len(stored)+want)
		waitSettled(t, b)
		stop()
		if n := streamMsgs(t, n.js, "PLEG"); n != uint64(len(got)) {
			t.Errorf("the stream holds %d events, want %d: %v", n, len(got), got)
		}
		if w := logs.TakeRecords(t, "WARN"); len(w) != 0 {
			t.Errorf("warnings: %v", w)
		}
		publishtest.WaitOutDuplicateWindow(t, n.js, "PLEG")
		stored = got
		return got[len(got)-want:]
	}
	checkLines(t, runOnce(3), []string{"ContainerStarted shop/web-0", "ContainerStarted shop/web-0/keep", "ContainerStarted shop/web-0/gone"})

	// While the bridge is down, a running container disappears.
	if err := n.model.RemoveContainer(ids[1]); err != nil {
		t.Fatal(err)
	}
	checkLines(t, runOnce(2), []string{"ContainerDied shop/web-0/gone", "ContainerRemoved shop/web-0/gone"})

	n.startContainer(t, sb, "fresh")
	checkLines(t, runOnce(1), []string{"ContainerStarted shop/web-0/fresh"})
}

// TestARestartAfterTheDuplicateWindowStoresNothingACrashForgot: a crash
// lost the checkpoint's last acks (its state is a copy of the data
// directory taken before them), and the restart comes after the stream's
// duplicate window. The checkpoint's sequence tells the restarted bridge
// where to read the stream from; it finds the event the crash forgot and
// publishes only what is new.
func TestARestartAfterTheDuplicateWindowStoresNothingACrashForgot(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	dir := t.TempDir()
	opts := testOptions(n.endpoint, n.url, dir)
	opts.Stream.DuplicateWindow = 100 * time.Millisecond // the shortest JetStream takes
	sb, _ := n.startPod(t, "first")
	_, stop := runBridge(t, opts)
	fetchAll(t, n.js, "PLEG", 2)
	stop()
	st, err := datadir.Open(dir, datadir.Options{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Checkpoint().Sequence(); got != 2 {
		t.Errorf("checkpoint sequence after two events = %d, want 2", got)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	crashed := t.TempDir()
	data, err := os.ReadFile(filepath.Join(dir, datadir.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crashed, datadir.FileName), data, 0o600); err != nil {
		t.Fatal(err)
	}

	// The run whose ack the crash loses.
	n.startContainer(t, sb, "second")
	_, stop = runBridge(t, opts)
	fetchAll(t, n.js, "PLEG", 3)
	stop()
	publishtest.WaitOutDuplicateWindow(t, n.js, "PLEG")

	n.startContainer(t, sb, "third")
	opts.DataDir = crashed
	_, stop = runBridge(t, opts)
	got := fetchAll(t, n.js, "PLEG", 4)
	stop() // delivers what the generator sent: a re-publication would be in by now
	checkLines(t, got[3:], []string{"ContainerStarted shop/web-0/third"})
	s, err := n.js.Stream(t.Context(), "PLEG")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 4 {
		t.Errorf("stream holds %d events, want 4: %q", info.State.Msgs, fetchAll(t, n.js, "PLEG", int(info.State.Msgs)))
	}
}

// TestRunWithoutADataDirectoryKeepsNothing runs memory only: a restart
// publishes the node's running containers again, as a first start does.
func TestRunWithoutADataDirectoryKeepsNothing(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	n.startPod(t, "app")
	for _, stream := range []string{"MEM1", "MEM2"} {
		opts := testOptions(n.endpoint, n.url, "")
		opts.Stream.Name, opts.SubjectPrefix = stream, strings.ToLower(stream)
		_, stop := runBridge(t, opts)
		checkLines(t, fetchAll(t, n.js, stream, 2), []string{"ContainerStarted shop/web-0", "ContainerStarted shop/web-0/app"})
		stop()
	}
}
