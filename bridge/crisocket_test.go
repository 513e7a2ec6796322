package bridge

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// TestMissingCRISocketIsNamedOnceAndRetriedUntilItAppears starts the bridge
// before its runtime, as a DaemonSet may on a booting node: the log names
// the missing socket and says the bridge keeps retrying, at Warn once (the
// relist's failure once more, with its own words), every retry after that
// at Debug; once the runtime serves the socket, the first relist says at
// Info what it found.
func TestMissingCRISocketIsNamedOnceAndRetriedUntilItAppears(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	_, url := publishtest.NewServer(t)
	h := newRecordingHandler()
	b, err := New(Options{
		Node: "node-1", CRIEndpoint: "unix://" + sock, Mode: generator.ModeAuto,
		RelistPeriod: 20 * time.Millisecond, NATS: NATSOptions{URL: url}, DataDir: t.TempDir(),
		Stream: StreamOptions{Manage: true}, Logger: slog.New(h),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	missing, _ := h.waitFor(t, "the CRI socket does not exist")
	if missing.level != slog.LevelWarn || missing.attrs["path"] != sock || !strings.Contains(missing.msg, "keeps retrying") {
		t.Errorf("missing socket logged as %+v, want at Warn with path %s, saying it keeps retrying", missing, sock)
	}
	var warns []logRecord
	for range 4 {
		r, seen := h.waitFor(t, "relist failed")
		for _, r := range append(seen, r) {
			if r.level >= slog.LevelWarn {
				warns = append(warns, r)
			}
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0].attrs["err"], sock) {
		t.Errorf("4 failed relists logged at Warn %d times, want once naming %s: %+v", len(warns), sock, warns)
	}

	// The runtime comes up with a running pod.
	model := crisim.NewRuntime(crisim.Options{})
	sb, err := model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"})
	if err := model.StartContainer(c); err != nil {
		t.Fatal(err)
	}
	lis, err := crisim.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- crisim.NewServer(model, crisim.ServerOptions{}).Serve(sctx, lis) }()
	t.Cleanup(func() { stop(); <-served })

	first, _ := h.waitFor(t, "first relist done")
	want := map[string]string{"pods": "1", "sandboxes": "1", "containers": "1", "running": "1", "configured_mode": "auto"}
	for k, v := range want {
		if first.attrs[k] != v {
			t.Errorf("first relist %s = %q, want %q (%+v)", k, first.attrs[k], v, first)
		}
	}
	if first.level != slog.LevelInfo || first.attrs["mode"] == "" {
		t.Errorf("first relist logged as %+v, want at Info with the mode", first)
	}
}
