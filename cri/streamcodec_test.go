package cri

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
)

// keptOfEvent returns what listCodec promises to decode of the stream
// message ev, as protobuf decoded it, with the sandbox annotations in
// annotations: the message's container ID, type and time; its sandbox
// status's ID, metadata, state, creation time, labels and those
// annotations; of each container status its ID, metadata, state, times,
// exit code, reason, message, image (name as given and as resolved) and
// image reference, and of its labels the kubelet's identity labels only
// where its metadata names no container. Package generator's
// streamread_test.go strips a message the same way to show that the
// generator makes the same of it: the two must agree.
func keptOfEvent(ev *runtimeapi.ContainerEventResponse, annotations []string) *runtimeapi.ContainerEventResponse {
	out := &runtimeapi.ContainerEventResponse{ContainerId: ev.GetContainerId(), ContainerEventType: ev.GetContainerEventType(), CreatedAt: ev.GetCreatedAt()}
	if sb := ev.GetPodSandboxStatus(); sb != nil {
		out.PodSandboxStatus = &runtimeapi.PodSandboxStatus{Id: sb.GetId(), Metadata: proto.CloneOf(sb.GetMetadata()), State: sb.GetState(),
			CreatedAt: sb.GetCreatedAt(), Labels: maps.Clone(sb.GetLabels()), Annotations: keptAnnotations(sb.GetAnnotations(), annotations)}
	}
	for _, st := range ev.GetContainersStatuses() {
		k := &runtimeapi.ContainerStatus{Id: st.GetId(), Metadata: proto.CloneOf(st.GetMetadata()), State: st.GetState(),
			CreatedAt: st.GetCreatedAt(), StartedAt: st.GetStartedAt(), FinishedAt: st.GetFinishedAt(), ExitCode: st.GetExitCode(),
			ImageRef: st.GetImageRef(), Reason: st.GetReason(), Message: st.GetMessage()}
		if img := st.GetImage(); img != nil {
			k.Image = &runtimeapi.ImageSpec{Image: img.GetImage(), UserSpecifiedImage: img.GetUserSpecifiedImage()}
		}
		if st.GetMetadata().GetName() == "" {
			for key, v := range st.GetLabels() {
				if identityLabel([]byte(key)) == "" {
					continue
				}
				if k.Labels == nil {
					k.Labels = map[string]string{}
				}
				k.Labels[key] = v
			}
		}
		out.ContainersStatuses = append(out.ContainersStatuses, k)
	}
	return out
}

// keptAnnotations returns the annotations of all that are in keep, nil if
// none.
func keptAnnotations(all map[string]string, keep []string) map[string]string {
	var out map[string]string
	for k, v := range all {
		if slices.Contains(keep, k) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// streamCodecCases are recorded containerd streams (package generator's
// recordings, which its replay test replays) and kubelet-like messages.
func streamCodecCases(t testing.TB) []*runtimeapi.ContainerEventResponse {
	evs := crisimtest.KubeletEvents(t, 12, 40)
	for _, f := range []string{"../generator/testdata/cri-events/containerd-v2.4.2.jsonl", "../generator/testdata/cri-events/containerd-v1.7.35.jsonl"} {
		evs = append(evs, crisimtest.ReadRecording(t, f)...)
	}
	return evs
}

// checkStreamCodec holds listCodec's decoding of the stream message b to
// protobuf's, field by field, for what the codec promises to decode
// (keptOfEvent). It reports whether protobuf could decode b at all.
func checkStreamCodec(t *testing.T, c listCodec, b []byte) bool {
	t.Helper()
	var whole runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &whole); err != nil {
		return false
	}
	var got runtimeapi.ContainerEventResponse
	if err := c.Unmarshal(pieces(b, 97), &got); err != nil {
		t.Fatalf("listCodec refused what protobuf decodes: %v", err)
	}
	want := keptOfEvent(&whole, c.annotations)
	if diff := cmp.Diff(want, &got, protocmp.Transform()); diff != "" {
		t.Fatalf("%s %s (-protobuf, what listCodec keeps of it +listCodec):\n%s", whole.GetContainerEventType(), whole.GetContainerId(), diff)
	}
	return true
}

// TestStreamCodecMatchesProtobuf: for recorded and kubelet-like messages,
// with and without a pod annotation allowlist, listCodec decodes what it
// promises to as protobuf does, message by message and as one stream's
// codec decodes them in turn (remembering each sandbox's labels and
// annotations).
func TestStreamCodecMatchesProtobuf(t *testing.T) {
	t.Parallel()
	evs := streamCodecCases(t)
	for _, annotations := range [][]string{nil, {"kubernetes.io/config.source", "e2e/created-by", "absent"}} {
		for _, c := range []listCodec{newListCodec(annotations), newListCodec(annotations).forStream()} {
			for _, ev := range evs {
				b, err := proto.Marshal(ev)
				if err != nil {
					t.Fatal(err)
				}
				if !checkStreamCodec(t, c, b) {
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
	evs := crisimtest.KubeletEvents(t, 2, 4)
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
	b, err := proto.Marshal(crisimtest.KubeletEvents(t, 1, 3)[4])
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
// decodes what it promises to as protobuf does; nothing makes it panic.
func FuzzStreamCodecMatchesProtobuf(f *testing.F) {
	for _, ev := range crisimtest.KubeletEvents(f, 2, 4)[:9] {
		b, err := proto.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	c := newListCodec([]string{"kubernetes.io/config.source"})
	f.Fuzz(func(t *testing.T, b []byte) {
		if !checkStreamCodec(t, c, b) {
			var got runtimeapi.ContainerEventResponse
			_ = c.Unmarshal(pieces(b, 97), &got) // must not panic
			return
		}
		// A stream's codec, the message twice: the second time its
		// sandbox's maps are the remembered ones.
		s := c.forStream()
		checkStreamCodec(t, s, b)
		checkStreamCodec(t, s, b)
	})
}

// BenchmarkStreamEventDecode compares the decoding of a kubelet pod's stream
// message (a sandbox status and five container statuses) by protobuf and
// by listCodec.
func BenchmarkStreamEventDecode(b *testing.B) {
	ev := crisimtest.KubeletEvents(b, 1, 5)[7]
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
