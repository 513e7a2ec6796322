package generator

import (
	"bufio"
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/statecache"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The fuzz targets build CRI input from the fuzzer's bytes with
// proto.Unmarshal, so that every shape a runtime could send is reachable:
// nil messages, missing metadata, unknown enum values, duplicate IDs,
// containers that change pods, absurd timestamps. Their seeds are the
// recorded containerd streams (testdata/cri-events) and listings derived
// from them; `go test` runs the seeds and testdata/fuzz as plain tests.

// fuzzNow is the clock of the conversion targets: after the recordings, so
// that their timestamps are valid, and fixed, so that a finding replays.
func fuzzNow() time.Time { return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC) }

// maxStreamMessages bounds the messages one FuzzStreamMerge input is cut
// into, to keep each run short.
const maxStreamMessages = 64

// recordedEvents reads every recorded stream, in file order.
func recordedEvents(tb testing.TB) [][]*runtimeapi.ContainerEventResponse {
	tb.Helper()
	files, err := filepath.Glob("testdata/cri-events/*.jsonl")
	if err != nil || len(files) == 0 {
		tb.Fatalf("recordings missing: %v %v", files, err)
	}
	var out [][]*runtimeapi.ContainerEventResponse
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			tb.Fatal(err)
		}
		var evs []*runtimeapi.ContainerEventResponse
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			ev := &runtimeapi.ContainerEventResponse{}
			if err := protojson.Unmarshal(sc.Bytes(), ev); err != nil {
				tb.Fatalf("%s: decode line %d: %v", path, len(evs)+1, err)
			}
			evs = append(evs, ev)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			tb.Fatal(err)
		}
		out = append(out, evs)
	}
	return out
}

func marshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// checkTime fails the test unless t is unknown (zero) or plausible: not
// before 2000 and at most a minute after now.
func checkTime(t *testing.T, what string, tm, now time.Time) {
	t.Helper()
	if !tm.IsZero() && (tm.Before(earliestValid) || tm.After(now.Add(maxClockSkew))) {
		t.Errorf("%s = %v: an absurd timestamp was taken at face value (now %v)", what, tm, now)
	}
}

// checkSighting checks what every sighting handed to the merge must hold.
func checkSighting(t *testing.T, s *sighting, now time.Time) {
	t.Helper()
	if s.info.ID == "" {
		t.Errorf("a sighting without container ID: %+v", s)
	}
	if s.state > stateGone {
		t.Errorf("sighting %s has state %d, beyond gone", s.info.ID, s.state)
	}
	checkTime(t, "createdAt of "+s.info.ID, s.createdAt, now)
	checkTime(t, "startedAt of "+s.info.ID, s.startedAt, now)
	checkTime(t, "finishedAt of "+s.info.ID, s.finishedAt, now)
	if s.exitCode != nil && s.state != stateExited {
		t.Errorf("sighting %s in state %s carries an exit code", s.info.ID, s.state)
	}
}

// checkEvents checks what every event the generator produces must hold.
func checkEvents(t *testing.T, evs []Event, now time.Time) {
	t.Helper()
	for _, e := range evs {
		if e.Pod.UID == "" || e.Container.ID == "" {
			t.Errorf("event %s without pod UID or container ID: %+v", e.Type, e)
		}
		if bit(e.Type) == 0 {
			t.Errorf("event of unknown type %q", e.Type)
		}
		checkTime(t, "time of "+string(e.Type), e.Time, now)
		checkTime(t, "startedAt of "+string(e.Type), e.StartedAt, now)
		checkTime(t, "finishedAt of "+string(e.Type), e.FinishedAt, now)
		if e.ObservedAt.IsZero() || e.Time.IsZero() {
			t.Errorf("event %s of %s without observation time or time", e.Type, e.Container.ID)
		}
	}
}

// logRecorder is a slog.Handler that keeps the attributes of Warn records,
// to check that every rejection names what it rejected. Safe for concurrent
// use.
type logRecorder struct {
	mu    sync.Mutex
	warns []map[string]string // guarded by mu
}

func (h *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *logRecorder) WithGroup(string) slog.Handler                { return h }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.warns = append(h.warns, m)
	return nil
}

// warned reports whether a Warn record has every one of the attributes.
func (h *logRecorder) warned(attrs map[string]string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.ContainsFunc(h.warns, func(m map[string]string) bool {
		for k, v := range attrs {
			if m[k] != v {
				return false
			}
		}
		return true
	})
}

// FuzzStreamBatch converts one GetContainerEvents message. A message is
// either rejected with an error that names it, or it becomes a view of one
// pod with a pod UID (or, as containerd 1.7 sends a sandbox's removal, of
// one container with none, left for the merge to place), whose sightings all
// have IDs and no absurd timestamp.
func FuzzStreamBatch(f *testing.F) {
	for _, rec := range recordedEvents(f) {
		for _, ev := range rec {
			f.Add(marshal(f, ev))
		}
	}
	now := fuzzNow()
	for _, ev := range []*runtimeapi.ContainerEventResponse{
		{},
		{ContainerId: "c", ContainerEventType: 99, CreatedAt: -1},
		{ContainerId: "c", PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "sb"}},
		{ContainerId: "c", CreatedAt: now.Add(time.Hour).UnixNano(), PodSandboxStatus: &runtimeapi.PodSandboxStatus{
			Id: "sb", State: 7, Labels: map[string]string{labelPodUID: "uid-1"}},
			ContainersStatuses: []*runtimeapi.ContainerStatus{nil, {}, {Id: "c", State: 9, ExitCode: 3, FinishedAt: 1}, {Id: "c", State: runtimeapi.ContainerState_CONTAINER_EXITED}}},
	} {
		f.Add(marshal(f, ev))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ev := &runtimeapi.ContainerEventResponse{}
		if proto.Unmarshal(data, ev) != nil {
			return
		}
		b, scope, err := streamBatch(nil, ev, now, metaFilter{}, nil)
		if err != nil {
			id := ev.GetContainerId()
			if id == "" {
				id = "no container ID"
			}
			if !strings.Contains(err.Error(), id) {
				t.Errorf("rejection %q does not name container %q", err, ev.GetContainerId())
			}
			return
		}
		if b == nil || len(b.pods) != 1 || b.source != SourceEvented {
			t.Fatalf("batch %+v, want one evented pod", b)
		}
		if b.at.IsZero() {
			t.Error("a batch without time")
		}
		checkTime(t, "the batch's time", b.at, now)
		p := b.pods[0]
		if p.complete {
			t.Error("a stream message's view is complete; it is partial")
		}
		if p.pod.UID == "" && (ev.GetPodSandboxStatus() != nil || len(p.containers) != 1 || p.containers[0].info.ID != ev.GetContainerId()) {
			t.Errorf("a view without pod UID for a message with a sandbox status, or of more than its container: %+v", p)
		}
		if !slices.ContainsFunc(p.containers, func(s sighting) bool { return s.info.ID == ev.GetContainerId() }) {
			t.Errorf("the view does not hold the event's own container %s", ev.GetContainerId())
		}
		for i := range p.containers {
			checkSighting(t, &p.containers[i], now)
		}
		if scope != nil && (scope.podUID == "" || scope.sandboxID == "") {
			t.Errorf("targeted relist without pod or sandbox: %+v", scope)
		}
	})
}

// listing is a Runtime serving fixed listings and statuses, for
// FuzzRelist. It remembers what it returned last. Safe for concurrent use.
type listing struct {
	sandboxes     []*runtimeapi.PodSandbox
	containers    []*runtimeapi.Container
	statuses      []*runtimeapi.ContainerStatus
	ignoreFilters bool // a runtime that lists everything whatever is asked

	mu             sync.Mutex
	lastSandboxes  []*runtimeapi.PodSandbox // guarded by mu
	lastContainers []*runtimeapi.Container  // guarded by mu
}

func (l *listing) Version(context.Context) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fuzz"}, nil
}

func (l *listing) ListPodSandbox(_ context.Context, f *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	out := l.sandboxes
	if f.GetId() != "" && !l.ignoreFilters {
		out = slices.DeleteFunc(slices.Clone(out), func(sb *runtimeapi.PodSandbox) bool { return sb.GetId() != f.GetId() })
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastSandboxes = out
	return out, nil
}

func (l *listing) ListContainers(_ context.Context, f *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	out := l.containers
	if f.GetPodSandboxId() != "" && !l.ignoreFilters {
		out = slices.DeleteFunc(slices.Clone(out), func(c *runtimeapi.Container) bool { return c.GetPodSandboxId() != f.GetPodSandboxId() })
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastContainers = out
	return out, nil
}

func (l *listing) ContainerStatus(_ context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	for _, st := range l.statuses {
		if st.GetId() == id {
			return st, nil
		}
	}
	if len(l.statuses) > 0 && l.statuses[0] != nil && l.ignoreFilters {
		return l.statuses[0], nil // a status of another container: malformed too
	}
	return nil, status.Errorf(codes.NotFound, "container %s", id)
}

func (l *listing) WatchEvents(ctx context.Context, _ func(*runtimeapi.ContainerEventResponse)) error {
	<-ctx.Done()
	return ctx.Err()
}

// listedSandbox and listedContainer turn the statuses a stream message
// carries into the listing entries a relist at that moment would have read.
func listedSandbox(st *runtimeapi.PodSandboxStatus) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{Id: st.GetId(), Metadata: st.GetMetadata(), State: st.GetState(), CreatedAt: st.GetCreatedAt(),
		Labels: st.GetLabels(), Annotations: st.GetAnnotations(), RuntimeHandler: st.GetRuntimeHandler()}
}

func listedContainer(sandboxID string, st *runtimeapi.ContainerStatus) *runtimeapi.Container {
	return &runtimeapi.Container{Id: st.GetId(), PodSandboxId: sandboxID, Metadata: st.GetMetadata(), Image: st.GetImage(),
		ImageRef: st.GetImageRef(), State: st.GetState(), CreatedAt: st.GetCreatedAt(), Labels: st.GetLabels(), Annotations: st.GetAnnotations()}
}

// FuzzRelist relists a runtime whose listings and statuses are the fuzzer's
// (whole node, one sandbox, or one sandbox's containers; with filters obeyed
// or not) and merges the result. Every listed object either reaches the
// merge, with a pod UID and no absurd timestamp, or is logged at Warn with
// its ID and counted; the events have pod UIDs and plausible times.
func FuzzRelist(f *testing.F) {
	// Listings as a relist would have read them after each message of the
	// recordings.
	for _, rec := range recordedEvents(f) {
		sandboxes := map[string]*runtimeapi.PodSandbox{}
		containers := map[string]*runtimeapi.Container{}
		statuses := map[string]*runtimeapi.ContainerStatus{}
		for i, ev := range rec {
			if sbs := ev.GetPodSandboxStatus(); sbs != nil {
				sandboxes[sbs.GetId()] = listedSandbox(sbs)
				for _, st := range ev.GetContainersStatuses() {
					containers[st.GetId()] = listedContainer(sbs.GetId(), st)
					statuses[st.GetId()] = st
				}
			}
			if ev.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
				delete(sandboxes, ev.GetContainerId())
				delete(containers, ev.GetContainerId())
				delete(statuses, ev.GetContainerId())
			}
			sbl := &runtimeapi.ListPodSandboxResponse{}
			for _, id := range slices.Sorted(maps.Keys(sandboxes)) {
				sbl.Items = append(sbl.Items, sandboxes[id])
			}
			cl := &runtimeapi.ListContainersResponse{}
			stl := &runtimeapi.ContainerEventResponse{}
			for _, id := range slices.Sorted(maps.Keys(containers)) {
				cl.Containers = append(cl.Containers, containers[id])
				stl.ContainersStatuses = append(stl.ContainersStatuses, statuses[id])
			}
			f.Add(marshal(f, sbl), marshal(f, cl), marshal(f, stl), uint8(i%6))
		}
	}
	f.Add([]byte{}, marshal(f, &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		{}, {Id: "orphan"}, {Id: "c", PodSandboxId: "gone", Labels: map[string]string{labelPodUID: "uid-1"}, State: 42, CreatedAt: -5},
	}}), []byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, sandboxes, containers, statuses []byte, mode uint8) {
		var sbl runtimeapi.ListPodSandboxResponse
		var cl runtimeapi.ListContainersResponse
		var stl runtimeapi.ContainerEventResponse
		if proto.Unmarshal(sandboxes, &sbl) != nil || proto.Unmarshal(containers, &cl) != nil || proto.Unmarshal(statuses, &stl) != nil {
			return
		}
		rt := &listing{sandboxes: sbl.GetItems(), containers: cl.GetContainers(), statuses: stl.GetContainersStatuses(), ignoreFilters: mode&4 != 0}
		logs := &logRecorder{}
		sink := &sliceSink{}
		g := New(rt, sink, Options{Logger: slog.New(logs)})
		var scope *relistScope
		switch mode % 3 {
		case 1: // a sandbox's stop: the sandbox and its containers
			if i := slices.IndexFunc(rt.sandboxes, func(sb *runtimeapi.PodSandbox) bool { return sb.GetId() != "" && sandboxPod(sb).UID != "" }); i >= 0 {
				scope = &relistScope{podUID: sandboxPod(rt.sandboxes[i]).UID, sandboxID: rt.sandboxes[i].GetId()}
			}
		case 2: // a container's stop: its sandbox's containers
			if i := slices.IndexFunc(rt.containers, func(c *runtimeapi.Container) bool { return c.GetPodSandboxId() != "" }); i >= 0 {
				scope = &relistScope{podUID: "uid-scope", sandboxID: rt.containers[i].GetPodSandboxId(), containersOnly: true}
			}
		}
		b, err := g.relister.relist(t.Context(), scope)
		if err != nil {
			t.Fatalf("relist: %v", err)
		}
		now := time.Now()
		seen := map[string]bool{}
		for _, p := range b.pods {
			if p.pod.UID == "" {
				t.Errorf("an observation without pod UID: %+v", p)
			}
			for i := range p.containers {
				checkSighting(t, &p.containers[i], now)
				seen[p.containers[i].info.ID] = true
			}
		}
		rt.mu.Lock()
		listedSandboxes, listedContainers := rt.lastSandboxes, rt.lastContainers
		rt.mu.Unlock()
		rejected := 0
		check := func(kind, id string) {
			if id != "" && seen[id] {
				return
			}
			rejected++
			if !logs.warned(map[string]string{"kind": kind, "id": id}) {
				t.Errorf("%s %q was neither merged nor logged as skipped", kind, id)
			}
		}
		for _, sb := range listedSandboxes {
			check("sandbox", sb.GetId())
		}
		for _, c := range listedContainers {
			check("container", c.GetId())
		}
		skipped := testutil.ToFloat64(g.metrics.skipped.WithLabelValues("sandbox")) + testutil.ToFloat64(g.metrics.skipped.WithLabelValues("container"))
		if (rejected > 0) != (skipped > 0) {
			t.Errorf("%d objects rejected, %v counted in pleg_bridge_runtime_objects_skipped_total", rejected, skipped)
		}

		if err := g.merge.apply(t.Context(), b); err != nil {
			t.Fatalf("apply: %v", err)
		}
		checkEvents(t, sink.events, now)
		g.merge.cache.Range(func(uid string, _ statecache.Entry[*podRecord]) bool {
			if uid == "" {
				t.Error("the cache holds a pod without UID")
			}
			return true
		})
	})
}

// FuzzStreamMerge merges a sequence of stream messages, as the merge
// goroutine does: the input is a protobuf message whose length-delimited
// fields are each one ContainerEventResponse (the recorded streams are the
// seeds). Nothing panics, malformed messages are skipped and logged, and
// every event has a pod UID and plausible times.
func FuzzStreamMerge(f *testing.F) {
	for _, rec := range recordedEvents(f) {
		var stream []byte
		for _, ev := range rec {
			stream = protowire.AppendTag(stream, 1, protowire.BytesType)
			stream = protowire.AppendBytes(stream, marshal(f, ev))
		}
		f.Add(stream)
	}
	// A container that changes pods, then a removal without sandbox status.
	var moving []byte
	for _, ev := range []*runtimeapi.ContainerEventResponse{
		{ContainerId: "c", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
			PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "sb1", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid-1"}}},
		{ContainerId: "c", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
			PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "sb2", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid-2"}}},
		{ContainerId: "c", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT},
	} {
		moving = protowire.AppendTag(moving, 1, protowire.BytesType)
		moving = protowire.AppendBytes(moving, marshal(f, ev))
	}
	f.Add(moving)
	f.Fuzz(func(t *testing.T, stream []byte) {
		var evs []*runtimeapi.ContainerEventResponse
		for len(stream) > 0 && len(evs) < maxStreamMessages {
			_, typ, n := protowire.ConsumeTag(stream)
			if n < 0 {
				return
			}
			stream = stream[n:]
			n = protowire.ConsumeFieldValue(0, typ, stream)
			if n < 0 {
				return
			}
			if typ == protowire.BytesType {
				v, _ := protowire.ConsumeBytes(stream)
				ev := &runtimeapi.ContainerEventResponse{}
				if proto.Unmarshal(v, ev) == nil {
					evs = append(evs, ev)
				}
			}
			stream = stream[n:]
		}
		sink := &sliceSink{}
		logs := &logRecorder{}
		g := New(&listing{}, sink, Options{Logger: slog.New(logs), Mode: ModeEvented})
		for _, ev := range evs {
			if err := g.merge.applyStreamEvent(t.Context(), ev); err != nil {
				t.Fatalf("applyStreamEvent: %v", err)
			}
			// A rejected message is logged with the reason, which names it.
			if _, _, err := streamBatch(nil, ev, time.Now(), metaFilter{}, nil); err != nil && !logs.warned(map[string]string{"err": err.Error()}) {
				t.Errorf("the rejection of a message for %q was not logged: %v", ev.GetContainerId(), err)
			}
		}
		checkEvents(t, sink.events, time.Now())
		g.merge.cache.Range(func(uid string, _ statecache.Entry[*podRecord]) bool {
			if uid == "" {
				t.Error("the cache holds a pod without UID")
			}
			return true
		})
	})
}
