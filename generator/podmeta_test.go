package generator

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestPodMetaKeepsPodLabelsAndAllowlistedAnnotationsOnly(t *testing.T) {
	t.Parallel()
	now := time.Now()
	sb := &runtimeapi.PodSandbox{
		Id:        "sb-1",
		CreatedAt: now.Add(-time.Hour).UnixNano(),
		Labels: map[string]string{
			"app": "web", "tier": "frontend",
			"io.kubernetes.pod.uid": "uid-1", "io.kubernetes.pod.name": "web-0", "io.kubernetes.pod.namespace": "shop",
		},
		Annotations: map[string]string{
			"team": "payments",
			"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 1<<20),
			"io.kubernetes.cri.sandbox-id":                     "sb-1",
		},
	}
	tests := []struct {
		name  string
		allow []string
		want  *PodMeta
	}{
		{
			name: "without an allowlist no annotation is kept",
			want: &PodMeta{Labels: map[string]string{"app": "web", "tier": "frontend"}},
		},
		{
			name:  "an allowlist keeps the keys it names that the sandbox has",
			allow: []string{"team", "absent"},
			want:  &PodMeta{Labels: map[string]string{"app": "web", "tier": "frontend"}, Annotations: map[string]string{"team": "payments"}},
		},
		{
			name:  "an allowlist naming no annotation of the sandbox gives empty annotations",
			allow: []string{"absent"},
			want:  &PodMeta{Labels: map[string]string{"app": "web", "tier": "frontend"}, Annotations: map[string]string{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := metaFilter{annotations: tt.allow}.podMeta(sb, now)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("podMeta (-want +got):\n%s", diff)
			}
			if got.sandboxID != "sb-1" || !got.sandboxCreated.Equal(time.Unix(0, sb.CreatedAt)) {
				t.Errorf("podMeta from sandbox %q created %v, want sb-1 at %v", got.sandboxID, got.sandboxCreated, time.Unix(0, sb.CreatedAt))
			}
		})
	}

	t.Run("a sandbox with only the kubelet's labels has empty labels, not none", func(t *testing.T) {
		got := metaFilter{}.podMeta(&runtimeapi.PodSandbox{Id: "sb-2", Labels: map[string]string{"io.kubernetes.pod.uid": "u"}}, now)
		if got.Labels == nil || len(got.Labels) != 0 {
			t.Errorf("labels = %#v, want an empty map", got.Labels)
		}
	})
}

func TestPodMetaOfTheNewestSandboxWins(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	meta := func(sb string, created time.Time, app string) *PodMeta {
		return &PodMeta{Labels: map[string]string{"app": app}, sandboxID: sb, sandboxCreated: created}
	}
	old, newer := meta("sb-old", t0, "v1"), meta("sb-new", t0.Add(time.Minute), "v2")
	restored := NewPodMeta(map[string]string{"app": "v0"}, nil)
	tests := []struct {
		name     string
		old, obs *PodMeta
		want     *PodMeta
	}{
		{"metadata is taken where none was known", nil, old, old},
		{"a view without metadata keeps what is known", old, nil, old},
		{"a newer sandbox replaces an older one's metadata", old, newer, newer},
		{"an older sandbox seen later does not replace a newer one's", newer, old, newer},
		{"the same sandbox read again keeps the first copy", old, meta("sb-old", t0, "v1"), old},
		{"a sandbox of unknown age does not replace a known one", old, meta("sb-x", time.Time{}, "vx"), old},
		{"a sandbox replaces metadata restored without its sandbox", restored, old, old},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mergePodIdentity(Pod{UID: "u", Meta: tt.old}, Pod{UID: "u", Meta: tt.obs})
			if got.Meta != tt.want {
				t.Errorf("merged meta = %+v, want %+v", got.Meta, tt.want)
			}
		})
	}
}

func TestRelistMetadata(t *testing.T) {
	t.Parallel()
	m := crisim.NewRuntime(crisim.Options{})
	sb := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1", Labels: map[string]string{"app": "web"}}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
	must(0, m.InjectContainer(&runtimeapi.Container{Id: "c-orphan", PodSandboxId: "missing", State: runtimeapi.ContainerState_CONTAINER_RUNNING,
		Labels: map[string]string{"io.kubernetes.pod.uid": "uid-2", "io.kubernetes.pod.namespace": "shop", "io.kubernetes.pod.name": "lost-0", "app": "not-a-pod-label"}}, nil))
	now := time.Now()
	cached := map[string]*PodMeta{}
	r := &relister{
		metrics:    newMetrics(),
		logger:     slog.New(slog.DiscardHandler),
		lookupMeta: func(uid string) *PodMeta { return cached[uid] },
	}

	group := func(at time.Time) map[string]*podObservation {
		seenBad := map[string]bool{}
		return r.group(r.viewSandboxes(m.ListPodSandbox(nil), at, seenBad), m.ListContainers(nil), at, nil, seenBad)
	}
	pods := group(now)

	t.Run("a pod found through its sandbox has the sandbox's labels", func(t *testing.T) {
		if got := pods["uid-1"].pod.Meta; !got.Equal(NewPodMeta(map[string]string{"app": "web"}, nil)) {
			t.Errorf("pod uid-1 meta = %+v", got)
		}
		if len(pods["uid-1"].containers) != 2 {
			t.Errorf("pod uid-1 has %d sightings, want sandbox %s and container %s", len(pods["uid-1"].containers), sb, c)
		}
	})
	t.Run("a container whose sandbox is unknown leaves its pod's labels unknown", func(t *testing.T) {
		if got := pods["uid-2"].pod.Meta; got != nil {
			t.Errorf("pod uid-2 meta = %+v, want nil: a container's labels are not its pod's", got)
		}
	})
	t.Run("a sandbox the cache took its metadata from is not read again", func(t *testing.T) {
		cached["uid-1"] = pods["uid-1"].pod.Meta
		again := group(now.Add(time.Second))
		if again["uid-1"].pod.Meta != cached["uid-1"] {
			t.Error("a steady relist built new metadata for a sandbox the cache holds it of")
		}
		rec, evs := mergePod(&podRecord{pod: again["uid-1"].pod}, podObservation{pod: again["uid-1"].pod}, SourceRelist, now)
		if rec.pod.Meta != cached["uid-1"] || evs != nil {
			t.Errorf("merge of the same metadata changed the pod: %+v, events %v", rec.pod, evs)
		}
	})
}

func TestStreamCarriesTheSandboxMetadata(t *testing.T) {
	t.Parallel()
	m := crisim.NewRuntime(crisim.Containerd24Options())
	sub := m.Subscribe(t.Context())
	sb := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"team": "payments", "other": "x"}}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
	must(0, m.StartContainer(c))
	now := time.Now()
	want := NewPodMeta(map[string]string{"app": "web"}, map[string]string{"team": "payments"})
	n := 0
	for len(sub.Events()) > 0 {
		ev := <-sub.Events()
		b, _, err := streamBatch(nil, ev, now, metaFilter{annotations: []string{"team"}}, nil)
		if err != nil {
			t.Fatalf("streamBatch(nil, %v): %v", ev, err)
		}
		if got := b.pods[0].pod.Meta; !got.Equal(want) {
			t.Errorf("%s event of %s: meta %+v, want %+v", ev.GetContainerEventType(), ev.GetContainerId(), got, want)
		}
		n++
	}
	if n == 0 {
		t.Fatal("the model emitted no events")
	}
}

// TestStreamTakesTheCachedMetadataOfItsSandbox: a stream message of a
// sandbox the cache read the pod's metadata from carries that metadata, not
// a copy read again; one of another sandbox of the pod (its next one) is
// read from the message.
func TestStreamTakesTheCachedMetadataOfItsSandbox(t *testing.T) {
	t.Parallel()
	m := crisim.NewRuntime(crisim.Containerd24Options())
	sub := m.Subscribe(t.Context())
	sb := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1", Labels: map[string]string{"app": "web"}}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
	must(0, m.StartContainer(c))
	ev := <-sub.Events()
	now := time.Now()
	cached := &PodMeta{Labels: map[string]string{"app": "web"}, sandboxID: sb}
	known := func(uid string) *PodMeta {
		if uid == "uid-1" {
			return cached
		}
		return nil
	}
	b, _, err := streamBatch(nil, ev, now, metaFilter{}, known)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.pods[0].pod.Meta; got != cached {
		t.Errorf("meta %p %+v, want the cached %p", got, got, cached)
	}
	cached = &PodMeta{Labels: map[string]string{"app": "old"}, sandboxID: "an-earlier-sandbox"}
	if b, _, err = streamBatch(nil, ev, now, metaFilter{}, known); err != nil {
		t.Fatal(err)
	}
	if got := b.pods[0].pod.Meta; got == cached || !got.Equal(NewPodMeta(map[string]string{"app": "web"}, nil)) || got.sandboxID != sb {
		t.Errorf("meta of a message from another sandbox than the cached one's = %+v, want the message's", got)
	}
}
