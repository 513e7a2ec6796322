package crisim

import (
	"context"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"
)

// BenchmarkChurnEvents measures what the runtime does for one churn pod's
// life (3 containers: 16 events, 12 of them Lifecycle transitions) with two
// subscribers, as in pleg-bench's throughput rows, where the bridge and the
// raw publisher both read the event stream. "model" is the model alone:
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
			subs := []*Subscription{rt.Subscribe(ctx), rt.Subscribe(ctx)}
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
