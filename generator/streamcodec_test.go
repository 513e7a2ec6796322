package generator

import (
	"fmt"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// kubeletEvents returns stream messages of a node the kubelet populated,
// one per container and event type, each with its pod's sandbox status
// and every container status of the pod, as containerd 2.x sends them, with
// what the generator never reads filled in too (network and Linux status,
// mounts, resources, annotations, image IDs), exit codes negative and
// positive.
func kubeletEvents(t testing.TB, pods, containers int) []*runtimeapi.ContainerEventResponse {
	t.Helper()
	rt := crisim.NewRuntime(crisim.Options{})
	if err := rt.PopulateKubelet(pods, containers); err != nil {
		t.Fatal(err)
	}
	byPod := map[string][]*runtimeapi.ContainerStatus{}
	for i, c := range rt.ListContainers(nil) {
		st, err := rt.ContainerStatus(c.Id)
		if err != nil {
			t.Fatal(err)
		}
		st = proto.CloneOf(st)
		st.Labels, st.Annotations = c.Labels, c.Annotations
		st.ImageId = "sha256:feed"
		st.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: "/var/lib/x"}}
		st.Resources = &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{CpuShares: 2}}
		if i%3 == 1 {
			st.State = runtimeapi.ContainerState_CONTAINER_EXITED
			st.ExitCode, st.Reason, st.Message = int32(i%5-2), "Error", fmt.Sprintf("exit %d <&>", i)
			st.FinishedAt = st.StartedAt + 1e9
		}
		if i%7 == 3 {
			st.Metadata = nil // named by its labels only
		}
		byPod[c.PodSandboxId] = append(byPod[c.PodSandboxId], st)
	}
	var out []*runtimeapi.ContainerEventResponse
	for _, sb := range rt.ListPodSandbox(nil) {
		resp, err := rt.PodSandboxStatus(sb.Id)
		if err != nil {
			t.Fatal(err)
		}
		sbs := proto.CloneOf(resp.GetStatus())
		sbs.Labels, sbs.Annotations = sb.Labels, sb.Annotations
		sbs.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: "10.0.0.1"}
		sbs.Linux = &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{}}}
		sbs.RuntimeHandler = "runc"
		statuses := byPod[sb.Id]
		ids := []string{sb.Id}
		for _, st := range statuses {
			ids = append(ids, st.Id)
		}
		for i, id := range ids {
			for _, typ := range []runtimeapi.ContainerEventType{
				runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
				runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
				runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT,
			} {
				ev := &runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ, CreatedAt: time.Now().UnixNano(),
					PodSandboxStatus: sbs, ContainersStatuses: statuses}
				if i%4 == 3 {
					ev.PodSandboxStatus = nil // as containerd 1.7 sends a sandbox's deletion
				}
				out = append(out, ev)
			}
		}
	}
	return out
}

// streamCodecCases are recorded containerd streams and kubelet-like
// messages.
func streamCodecCases(t testing.TB) []*runtimeapi.ContainerEventResponse {
	evs := kubeletEvents(t, 12, 40)
	for _, f := range []string{"testdata/cri-events/containerd-v2.4.2.jsonl", "testdata/cri-events/containerd-v1.7.35.jsonl"} {
		evs = append(evs, readRecording(t.(*testing.T), f)...)
	}
	return evs
}

// checkStreamCodec holds listCodec's decoding of the stream message b to
// protobuf's, by what the generator makes of each: the same batch and the
// same relist. It reports whether protobuf could decode b at all.
func checkStreamCodec(t *testing.T, c listCodec, meta metaFilter, b []byte) bool {
	t.Helper()
	var want runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &want); err != nil {
		return false
	}
	var got runtimeapi.ContainerEventResponse
	if err := c.Unmarshal(pieces(b, 97), &got); err != nil {
		t.Fatalf("listCodec refused what protobuf decodes: %v", err)
	}
	now := time.Unix(1_800_000_000, 0)
	wantBatch, wantScope, wantErr := streamBatch(nil, &want, now, meta, nil)
	gotBatch, gotScope, gotErr := streamBatch(nil, &got, now, meta, nil)
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("streamBatch error: from protobuf %v, from listCodec %v", wantErr, gotErr)
	}
	opts := []cmp.Option{cmp.AllowUnexported(batch{}, podObservation{}, sighting{}, relistScope{}, PodMeta{}), cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })}
	if diff := cmp.Diff(wantBatch, gotBatch, opts...); diff != "" {
		t.Fatalf("batch of %s %s (-protobuf +listCodec):\n%s", want.GetContainerEventType(), want.GetContainerId(), diff)
	}
	if diff := cmp.Diff(wantScope, gotScope, opts...); diff != "" {
		t.Fatalf("relist of %s %s (-protobuf +listCodec):\n%s", want.GetContainerEventType(), want.GetContainerId(), diff)
	}
	return true
}

// TestStreamCodecMatchesProtobuf: for recorded and kubelet-like messages,
// with and without a pod annotation allowlist, the generator makes the
// same of listCodec's partial decoding as of protobuf's whole one, message
// by message and as one stream's codec decodes them in turn (remembering
// each sandbox's labels and annotations).
func TestStreamCodecMatchesProtobuf(t *testing.T) {
	t.Parallel()
	evs := streamCodecCases(t)
	for _, annotations := range [][]string{nil, {"kubernetes.io/config.source", "e2e/created-by", "absent"}} {
		meta := metaFilter{annotations: annotations}
		for _, c := range []listCodec{newListCodec(annotations), newListCodec(annotations).forStream()} {
			for _, ev := range evs {
				b, err := proto.Marshal(ev)
				if err != nil {
					t.Fatal(err)
				}
				if !checkStreamCodec(t, c, meta, b) {
					t.Fatal("protobuf does not decode what it encoded")
				}
			}
		}
	}
}

// TestStreamCodecDecodesASandboxsMapsOnce: a stream's codec decodes a
// sandbox's labels and annotations from its first message, and its later
// messages share them; a message that sends the sandbox's ID after its
// labels (protobuf allows any order) is decoded whole, as it says.
func TestStreamCodecDecodesASandboxsMapsOnce(t *testing.T) {
	t.Parallel()
	annotations := []string{"kubernetes.io/config.source"}
	c := newListCodec(annotations).forStream()
	evs := kubeletEvents(t, 2, 4)
	decode := func(b []byte) *runtimeapi.PodSandboxStatus {
		t.Helper()
		var m runtimeapi.ContainerEventResponse
		if err := c.Unmarshal(pieces(b, 97), &m); err != nil {
			t.Fatal(err)
		}
		return m.GetPodSandboxStatus()
	}
	first, second := evs[0], evs[1]
	if first.GetPodSandboxStatus().GetId() != second.GetPodSandboxStatus().GetId() {
		t.Fatal("the first two messages are not of one sandbox")
	}
	a, b := decode(must(proto.Marshal(first))), decode(must(proto.Marshal(second)))
	if len(a.GetLabels()) == 0 || len(a.GetAnnotations()) == 0 {
		t.Fatalf("decoded labels %v, annotations %v: want some of each", a.GetLabels(), a.GetAnnotations())
	}
	if reflect.ValueOf(a.Labels).UnsafePointer() != reflect.ValueOf(b.Labels).UnsafePointer() ||
		reflect.ValueOf(a.Annotations).UnsafePointer() != reflect.ValueOf(b.Annotations).UnsafePointer() {
		t.Error("the second message of a sandbox decoded its labels and annotations again")
	}

	// The same sandbox ID, other labels, the ID after them on the wire.
	sbs := proto.CloneOf(first.GetPodSandboxStatus())
	sbs.Labels = map[string]string{"app": "relabelled", labelPodUID: sbs.GetMetadata().GetUid()}
	id := sbs.Id
	sbs.Id = ""
	wire := protowire.AppendTag(must(proto.Marshal(sbs)), 1, protowire.BytesType)
	wire = protowire.AppendString(wire, id)
	msg := protowire.AppendTag(must(proto.Marshal(&runtimeapi.ContainerEventResponse{ContainerId: id})), 4, protowire.BytesType)
	msg = protowire.AppendBytes(msg, wire)
	got := decode(msg)
	if got.GetId() != id || got.GetLabels()["app"] != "relabelled" {
		t.Errorf("a message with its sandbox's ID after the labels decoded as %s with labels %v, want %s with app=relabelled",
			got.GetId(), got.GetLabels(), id)
	}
}

func TestStreamCodecRefusesATruncatedMessage(t *testing.T) {
	t.Parallel()
	b, err := proto.Marshal(kubeletEvents(t, 1, 3)[4])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, len(b) / 3, len(b) - 1} {
		var got runtimeapi.ContainerEventResponse
		if err := newListCodec(nil).Unmarshal(pieces(b[:n], 97), &got); err == nil {
			t.Errorf("Unmarshal of the first %d of %d bytes succeeded, want an error", n, len(b))
		}
	}
}

// FuzzStreamCodecMatchesProtobuf: whatever protobuf decodes, listCodec
// decodes to the same batch; nothing makes it panic.
func FuzzStreamCodecMatchesProtobuf(f *testing.F) {
	for _, ev := range kubeletEvents(f, 2, 4)[:9] {
		b, err := proto.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	meta := metaFilter{annotations: []string{"kubernetes.io/config.source"}}
	c := newListCodec(meta.annotations)
	f.Fuzz(func(t *testing.T, b []byte) {
		if !checkStreamCodec(t, c, meta, b) {
			var got runtimeapi.ContainerEventResponse
			_ = c.Unmarshal(pieces(b, 97), &got) // must not panic
			return
		}
		// A stream's codec, the message twice: the second time its
		// sandbox's maps are the remembered ones.
		s := c.forStream()
		checkStreamCodec(t, s, meta, b)
		checkStreamCodec(t, s, meta, b)
	})
}

// BenchmarkStreamEventDecode compares the decoding of a kubelet pod's stream
// message (a sandbox status and five container statuses) by protobuf and
// by listCodec.
func BenchmarkStreamEventDecode(b *testing.B) {
	ev := kubeletEvents(b, 1, 5)[7]
	raw, err := proto.Marshal(ev)
	if err != nil {
		b.Fatal(err)
	}
	benchmarkDecoders(b, raw, func() proto.Message { return &runtimeapi.ContainerEventResponse{} })
	// A stream's codec, which has seen the sandbox: every message of a
	// pod but its first.
	b.Run("listCodec/stream", func(b *testing.B) {
		c := newListCodec(nil).forStream()
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if err := c.Unmarshal(pieces(raw, 16<<10), &runtimeapi.ContainerEventResponse{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestStreamStringsAreBounded: a stream's string sharer holds at most twice
// its limit, keeps what its messages keep repeating, and returns a string
// equal to the bytes it is given, shared or not.
func TestStreamStringsAreBounded(t *testing.T) {
	t.Parallel()
	l := &listDecoder{strs: recentMap[string]{size: 2}}
	first := l.str([]byte("pod-a"))
	for i := range 20 {
		if got := l.str([]byte("pod-a")); unsafe.StringData(got) != unsafe.StringData(first) {
			t.Fatalf("after %d other strings, a string repeated all along was not shared", i)
		}
		want := fmt.Sprintf("other-%d", i)
		if got := l.str([]byte(want)); got != want {
			t.Fatalf("str(%q) = %q", want, got)
		}
		if n := len(l.strs.recent) + len(l.strs.older); n > 4 {
			t.Fatalf("holds %d strings, want at most twice its limit of 2", n)
		}
	}
	if _, ok := l.strs.recent["other-0"]; ok {
		t.Error("a string not seen for 19 others is still held")
	}
	if _, ok := l.strs.older["other-0"]; ok {
		t.Error("a string not seen for 19 others is still held")
	}
}
