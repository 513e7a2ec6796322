package bridge

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// healthFixture is a pipeline over the simulated runtime (a real gRPC
// socket) and a real NATS server, built but not running: the tests drive
// relists themselves.
type healthFixture struct {
	p     *pipeline
	model *crisim.Runtime
	nats  *server.Server
}

func newHealthFixture(t *testing.T) *healthFixture {
	t.Helper()
	model := crisim.NewRuntime(crisim.Options{})
	_, endpoint := crisimtest.Serve(t, model)
	srv, url := publishtest.NewServer(t)
	opts := Options{
		Node: "node-1", CRIEndpoint: endpoint, Mode: generator.ModeGeneric,
		NATS: NATSOptions{URL: url}, DataDir: t.TempDir(),
	}.withDefaults()
	p, err := build(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	// What Run does first; the tests exercise the endpoint without Run.
	if err := ensureStream(t.Context(), p.js, opts, nil); err != nil {
		t.Fatal(err)
	}
	return &healthFixture{p: p, model: model, nats: srv}
}

// runningPod starts a pod with one running container in the runtime.
func (f *healthFixture) runningPod(t *testing.T) {
	t.Helper()
	sb, err := f.model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.model.StartContainer(c); err != nil {
		t.Fatal(err)
	}
}

// get serves one GET request through the bridge's handler.
func (f *healthFixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	f.p.handler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestHealthzFailsInTheKubeletsWordsUntilTheFirstRelist(t *testing.T) {
	t.Parallel()
	f := newHealthFixture(t)
	code, body := f.get(t, "/healthz")
	if code != http.StatusInternalServerError || !strings.HasPrefix(body, "PLEG is not healthy: pleg has yet to be successful") {
		t.Errorf("/healthz before a relist: %d %q", code, body)
	}
	if err := f.p.gen.Relist(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code, body := f.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after a relist: %d %q", code, body)
	}
}

func TestReadyzNeedsAFirstRelistAndNATS(t *testing.T) {
	t.Parallel()
	f := newHealthFixture(t)
	code, body := f.get(t, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "first relist not done yet") {
		t.Errorf("/readyz before a relist: %d %q", code, body)
	}
	if err := f.p.gen.Relist(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code, body := f.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after a relist: %d %q", code, body)
	}

	disconnected := f.p.nc.StatusChanged(nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	f.nats.Shutdown()
	f.nats.WaitForShutdown()
	<-disconnected // the client has noticed; without it the check would race
	code, body = f.get(t, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "NATS is") {
		t.Errorf("/readyz with NATS down: %d %q", code, body)
	}
	// Liveness is about relisting only: NATS being away must not restart
	// the pod.
	if code, body := f.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with NATS down: %d %q", code, body)
	}
}

func TestMetricsExposeTheKubeletPLEGEquivalents(t *testing.T) {
	t.Parallel()
	f := newHealthFixture(t)
	f.runningPod(t)
	if err := f.p.gen.Relist(t.Context()); err != nil {
		t.Fatal(err)
	}

	// The relist found the sandbox and its container running. The publisher
	// is not running, so both events wait in the outbox.
	const want = `
# HELP pleg_bridge_events_total Lifecycle events generated, by type and by the source that detected them.
# TYPE pleg_bridge_events_total counter
pleg_bridge_events_total{event_type="ContainerStarted",source="relist"} 2
# HELP pleg_bridge_events_dropped_total Lifecycle events given up without delivery: not encodable, or still undelivered when the drain timeout ended.
# TYPE pleg_bridge_events_dropped_total counter
pleg_bridge_events_dropped_total 0
# HELP pleg_bridge_outbox_events Lifecycle events accepted by the publisher and not yet acked: queued plus in flight.
# TYPE pleg_bridge_outbox_events gauge
pleg_bridge_outbox_events 2
# HELP pleg_bridge_relists_total Relists by kind (full, targeted) and result (ok, error).
# TYPE pleg_bridge_relists_total counter
pleg_bridge_relists_total{kind="full",result="ok"} 1
`
	if err := testutil.GatherAndCompare(f.p.reg, strings.NewReader(want),
		"pleg_bridge_events_total", "pleg_bridge_events_dropped_total", "pleg_bridge_outbox_events", "pleg_bridge_relists_total"); err != nil {
		t.Error(err)
	}

	// The rest of the kubelet PLEG's set (and the CRI and publish metrics)
	// exists after one relist. pleg_bridge_mode is set by Run, which this
	// test does not call, so it is not asserted here.
	code, body := f.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, name := range []string{
		"pleg_bridge_relist_duration_seconds",
		"pleg_bridge_relist_interval_seconds",
		"pleg_bridge_last_relist_timestamp_seconds",
		"pleg_bridge_events_total",
		"pleg_bridge_events_dropped_total",
		"pleg_bridge_publish_total",
		"pleg_bridge_publish_ack_duration_seconds",
		"pleg_bridge_outbox_events",
		"pleg_bridge_cri_requests_total",
		"pleg_bridge_cri_request_duration_seconds",
		"pleg_bridge_cri_stream_reconnects_total",
	} {
		if !strings.Contains(body, "\n# TYPE "+name+" ") {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	for _, sample := range []string{
		`pleg_bridge_cri_requests_total{operation="ListPodSandbox",result="OK"} 1`,
		`pleg_bridge_cri_requests_total{operation="ListContainers",result="OK"} 1`,
		`pleg_bridge_publish_total{result="acked"} 0`,
	} {
		if !strings.Contains(body, "\n"+sample+"\n") {
			t.Errorf("/metrics lacks %s", sample)
		}
	}
	if n, err := testutil.GatherAndCount(f.p.reg, "pleg_bridge_last_relist_timestamp_seconds"); err != nil || n != 1 {
		t.Errorf("pleg_bridge_last_relist_timestamp_seconds: %d series, %v", n, err)
	}
}
