package cri

import (
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// kubeletNode returns the listings of a node the kubelet populated, with an
// orphan container and a sandbox without metadata besides, as protobuf
// decodes them.
func kubeletNode(t testing.TB, pods, containers int) (*runtimeapi.ListPodSandboxResponse, *runtimeapi.ListContainersResponse) {
	t.Helper()
	rt := crisim.NewRuntime(crisim.Options{})
	if err := rt.PopulateKubelet(pods, containers); err != nil {
		t.Fatal(err)
	}
	if err := rt.InjectSandbox(&runtimeapi.PodSandbox{Id: "bare-sandbox", State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY,
		Labels: map[string]string{labelPodUID: "uid-x"}, Annotations: map[string]string{"team": "a"}}); err != nil {
		t.Fatal(err)
	}
	orphan := &runtimeapi.Container{Id: "orphan", PodSandboxId: "gone", State: runtimeapi.ContainerState_CONTAINER_EXITED,
		Labels: map[string]string{labelPodUID: "uid-y", labelPodName: "web", labelPodNamespace: "ns", labelContainerName: "app", "x": "y"}}
	if err := rt.InjectContainer(orphan, &runtimeapi.ContainerStatus{Id: "orphan"}); err != nil {
		t.Fatal(err)
	}
	return &runtimeapi.ListPodSandboxResponse{Items: rt.ListPodSandbox(nil)}, &runtimeapi.ListContainersResponse{Containers: rt.ListContainers(nil)}
}

// decodeWith decodes m with c as gRPC hands it a message: in pieces, as
// the transport's frames arrived (97 bytes here, so that items span
// pieces).
func decodeWith(t testing.TB, c listCodec, m proto.Message, into proto.Message) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(pieces(b, 97), into); err != nil {
		t.Fatalf("Unmarshal(%T) = %v", into, err)
	}
}

func pieces(b []byte, n int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(b) > n {
		out = append(out, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return append(out, mem.SliceBuffer(b))
}

func TestListCodecKeepsWhatTheGeneratorReads(t *testing.T) {
	t.Parallel()
	sbs, ctrs := kubeletNode(t, 10, 30)
	c := newListCodec([]string{"prometheus.io/port", "team"})

	var gotSbs runtimeapi.ListPodSandboxResponse
	decodeWith(t, c, sbs, &gotSbs)
	want := proto.CloneOf(sbs)
	for _, sb := range want.Items {
		sb.Annotations = maps.Collect(func(yield func(string, string) bool) {
			for k, v := range sb.Annotations {
				if (k == "prometheus.io/port" || k == "team") && !yield(k, v) {
					return
				}
			}
		})
		if len(sb.Annotations) == 0 {
			sb.Annotations = nil
		}
	}
	if diff := cmp.Diff(want, &gotSbs, protocmp.Transform()); diff != "" {
		t.Errorf("sandboxes (-want +got):\n%s", diff)
	}

	var gotCtrs runtimeapi.ListContainersResponse
	decodeWith(t, c, ctrs, &gotCtrs)
	wantCtrs := proto.CloneOf(ctrs)
	for _, ctr := range wantCtrs.Containers {
		ctr.Annotations, ctr.ImageId = nil, ""
		maps.DeleteFunc(ctr.Labels, func(k, _ string) bool {
			// The container's name label only where its metadata has none
			// (the orphan's).
			return identityLabel([]byte(k)) == "" || (k == labelContainerName && ctr.GetMetadata().GetName() != "")
		})
		if ctr.Image != nil {
			ctr.Image = &runtimeapi.ImageSpec{Image: ctr.Image.Image, UserSpecifiedImage: ctr.Image.UserSpecifiedImage}
		}
	}
	if diff := cmp.Diff(wantCtrs, &gotCtrs, protocmp.Transform()); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
}

func TestListCodecWithoutAnnotationsKeepsNone(t *testing.T) {
	t.Parallel()
	sbs, _ := kubeletNode(t, 4, 4)
	var got runtimeapi.ListPodSandboxResponse
	decodeWith(t, newListCodec(nil), sbs, &got)
	for _, sb := range got.Items {
		if sb.Annotations != nil {
			t.Errorf("sandbox %s kept annotations %v, want none", sb.Id, sb.Annotations)
		}
	}
}

func TestListCodecRefusesATruncatedListing(t *testing.T) {
	t.Parallel()
	_, ctrs := kubeletNode(t, 2, 4)
	b, err := proto.Marshal(ctrs)
	if err != nil {
		t.Fatal(err)
	}
	c := newListCodec(nil)
	for _, n := range []int{1, len(b) / 3, len(b) - 1} {
		var got runtimeapi.ListContainersResponse
		if err := c.Unmarshal(pieces(b[:n], 97), &got); err == nil {
			t.Errorf("Unmarshal of the first %d of %d bytes succeeded, want an error", n, len(b))
		}
	}
}

func TestListCodecDecodesOtherMessagesAsProtobufDoes(t *testing.T) {
	t.Parallel()
	st := &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: "c", Annotations: map[string]string{"a": "b"}}}
	var got runtimeapi.ContainerStatusResponse
	decodeWith(t, newListCodec(nil), st, &got)
	if diff := cmp.Diff(st, &got, protocmp.Transform()); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
}

// BenchmarkListDecode compares the decoding of one ListContainers response
// of 5,000 kubelet containers by protobuf and by listCodec, and by
// listCodec through its memo when nothing changed since the last full
// listing (listCodec/steady: a steady relist).
func BenchmarkListDecode(b *testing.B) {
	_, ctrs := kubeletNode(b, 1000, 5000)
	raw, err := proto.Marshal(ctrs)
	if err != nil {
		b.Fatal(err)
	}
	benchmarkDecoders(b, raw, func() proto.Message { return &runtimeapi.ListContainersResponse{} })
	b.Run("listCodec/steady", func(b *testing.B) {
		memos := &listMemos{}
		memos.arm()
		c := newListCodec(nil).withMemos(memos, true)
		for range 2 { // the first fills the memo
			if err := c.Unmarshal(pieces(raw, 16<<10), &runtimeapi.ListContainersResponse{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if err := c.Unmarshal(pieces(raw, 16<<10), &runtimeapi.ListContainersResponse{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchmarkDecoders compares the decoding of raw, a message of newMsg's
// type, by protobuf and by listCodec (in the 16 KB pieces gRPC hands it).
func benchmarkDecoders(b *testing.B, raw []byte, newMsg func() proto.Message) {
	b.Run("protobuf", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if err := proto.Unmarshal(raw, newMsg()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("listCodec", func(b *testing.B) {
		c := newListCodec(nil)
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if err := c.Unmarshal(pieces(raw, 16<<10), newMsg()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
