package datadir_test

import (
	"cmp"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// event is a Lifecycle event of container id in pod uid, observed at at.
func event(uid, id string, typ generator.LifecycleEventType, at time.Time) generator.Event {
	ev := generator.Event{
		Type: typ, Pod: generator.Pod{UID: uid, Namespace: "shop", Name: "web-" + uid},
		Container: generator.Container{ID: id, Name: "app", Attempt: 1, Image: "nginx:1.27", ImageRef: "nginx@sha256:0123"},
		State:     generator.StateRunning, StartedAt: t0, Time: at, DetectedBy: generator.SourceEvented, ObservedAt: at,
	}
	switch typ {
	case generator.ContainerDied:
		code := int32(2)
		ev.State, ev.ExitCode, ev.Reason, ev.Message, ev.FinishedAt = generator.StateExited, &code, "Error", "exit status 2", at
	case generator.ContainerRemoved:
		ev.State = generator.StateRemoved
	}
	return ev
}

// open opens the store in dir for node-1, with opts' spool bound, and
// returns it with what it logs.
func open(t *testing.T, dir string, opts datadir.Options) (*datadir.Store, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	if opts.Node == "" {
		opts.Node = "node-1"
	}
	opts.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := datadir.Open(dir, opts)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return s, logs
}

func closeStore(t *testing.T, s *datadir.Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// crashImage copies the store file of dir, as a crash at this moment
// would leave it, into a new directory, and returns that directory. The
// caller makes sure no write is under way (synctest.Wait, or no Run).
func crashImage(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, datadir.FileName))
	if err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	writeFile(t, filepath.Join(img, datadir.FileName), data)
	return img
}

// restoredAfterCrash returns what a bridge restarted on a crash image of
// dir restores, sorted.
func restoredAfterCrash(t *testing.T, dir string) []generator.Event {
	t.Helper()
	s, _ := open(t, crashImage(t, dir), datadir.Options{})
	defer closeStore(t, s)
	return sortEvents(s.Checkpoint().Restored())
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func sortEvents(evs []generator.Event) []generator.Event {
	evs = slices.Clone(evs)
	order := func(typ generator.LifecycleEventType) int {
		return slices.Index(generator.LifecycleEventTypes[:], typ)
	}
	slices.SortFunc(evs, func(a, b generator.Event) int {
		return cmp.Or(strings.Compare(a.Container.ID, b.Container.ID), cmp.Compare(order(a.Type), order(b.Type)))
	})
	return evs
}

func checkEvents(t *testing.T, what string, got []generator.Event, want ...generator.Event) {
	t.Helper()
	if diff := gocmp.Diff(sortEvents(want), sortEvents(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

// glob returns the names of the files in dir that match pattern.
func glob(t *testing.T, dir, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
