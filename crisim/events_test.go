package crisim

import (
	"context"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestSharedSubscribersGetOneMessageAndTheOthersACopyEach(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		shared1, shared2 := rt.subscribeShared(t.Context()), rt.subscribeShared(t.Context())
		own1, own2 := rt.Subscribe(t.Context()), rt.Subscribe(t.Context())
		sb, _ := rt.RunPodSandbox(PodConfig{Name: "p"})
		id, _ := rt.CreateContainer(sb, ContainerConfig{})
		if err := rt.StartContainer(id); err != nil {
			t.Fatal(err)
		}

		s1, s2, o1, o2 := drain(shared1), drain(shared2), drain(own1), drain(own2)
		if len(s1) != 4 || len(s2) != 4 || len(o1) != 4 || len(o2) != 4 {
			t.Fatalf("got %d, %d, %d and %d events, want 4 each", len(s1), len(s2), len(o1), len(o2))
		}
		for i := range s1 {
			if s1[i] != s2[i] {
				t.Errorf("event %d: the shared subscribers got two messages, want one", i)
			}
			if o1[i] == s1[i] || o2[i] == s1[i] || o1[i] == o2[i] {
				t.Errorf("event %d: a subscriber got a message it shares, want its own copy", i)
			}
			if diff := cmp.Diff(s1[i], o1[i], protocmp.Transform()); diff != "" {
				t.Errorf("event %d: the copy differs (-shared +copy):\n%s", i, diff)
			}
		}
		// An event shows the state at its time, also after the container
		// changed.
		created := s1[2]
		if created.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT {
			t.Fatalf("third event is %s, want the container's CREATED", created.ContainerEventType)
		}
		if got := created.ContainersStatuses[0].State; got != runtimeapi.ContainerState_CONTAINER_CREATED {
			t.Errorf("CREATED event shows the container %s after it started, want CONTAINER_CREATED", got)
		}
		// A subscriber that changes its copy changes nothing else.
		o1[3].ContainersStatuses[0].Labels["io.kubernetes.pod.name"] = "changed"
		o1[3].PodSandboxStatus.Annotations = map[string]string{"changed": "yes"}
		if diff := cmp.Diff(s1[3], o2[3], protocmp.Transform()); diff != "" {
			t.Errorf("a change to one copy shows elsewhere (-shared +other copy):\n%s", diff)
		}
		if st, _ := rt.ContainerStatus(id); st.Labels["io.kubernetes.pod.name"] != "p" {
			t.Errorf("container labels = %v after a subscriber changed its copy", st.Labels)
		}
	})
}

// BenchmarkChurnEvents measures what the runtime does for one churn pod's
// life (3 containers: 16 events, 12 of them Lifecycle transitions) with two
// subscribers, as in pleg-bench's throughput rows, where the bridge and the
// raw publisher both read the event stream, each through a shared
// subscription as the Server's streams do. "model" is the model alone:
// every event is built and handed to both subscribers. "marshal" adds what
// each gRPC stream then does with an event: marshal it. "kubelet" is
// "marshal" with the containers carrying the kubelet's annotations, as
// PopulateKubelet's do (about 1 KB each). It reports ns/transition too.
func BenchmarkChurnEvents(b *testing.B) {
	for _, bc := range []struct {
		name     string
		marshal  bool
		annotate bool
	}{
		{"model", false, false},
		{"marshal", true, false},
		{"kubelet", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rt := NewRuntime(Options{})
			subs := []*Subscription{rt.subscribeShared(ctx), rt.subscribeShared(ctx)}
			opts := ChurnOptions{ContainersPerPod: 3, Namespace: "churn"}
			rng := rand.New(rand.NewPCG(1, 2))
			var buf []byte
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; b.Loop(); n++ {
				plan := opts.plan(n, rng)
				plan.runFor = 0
				if bc.annotate {
					for i := range plan.containers {
						plan.containers[i].Annotations = kubeletContainerAnnotations(n, i)
					}
				}
				if _, err := runPod(ctx, rt, plan); err != nil {
					b.Fatal(err)
				}
				for _, sub := range subs {
					for len(sub.Events()) > 0 {
						ev := <-sub.Events()
						if bc.marshal {
							var err error
							if buf, err = (proto.MarshalOptions{}).MarshalAppend(buf[:0], ev); err != nil {
								b.Fatal(err)
							}
						}
					}
				}
			}
			transitions := 3 * (opts.ContainersPerPod + 1)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*transitions), "ns/transition")
			if err := subs[0].Err(); err != nil {
				b.Fatalf("subscription ended: %v", err)
			}
		})
	}
}
