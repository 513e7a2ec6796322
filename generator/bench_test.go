package generator_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
)

// benchContainersPerPod is the pod shape of the relist benchmark's nodes: a
// node of n containers has n/4 pod sandboxes besides them. Few containers
// per pod is the heavier case for the merge, which works pod by pod.
const benchContainersPerPod = 4

// BenchmarkRelist measures one full relist (ListPodSandbox, ListContainers,
// the status calls, the merge into the cache and the events handed to the
// sink) on nodes of 100, 1,000 and 30,000 running containers:
//
//   - relist=steady: nothing changed since the previous relist, the common
//     case: no status call, no event.
//   - relist=first: an empty cache, as after a start: a ContainerStatus call
//     and a ContainerStarted event for every container. Each op builds a new
//     Generator (sharing one Metrics, so that op is the relist and not
//     metric registration).
//
// runtime=fake reads the model directly through generatortest.FakeRuntime.
// The same relists through the real CRI client over a unix socket
// (runtime=grpc) are package cri's BenchmarkRelist. ns/op is the cost of
// one relist. The evented safety-net period (DefaultEventedRelistPeriod) is
// justified by the steady 30,000 case.
func BenchmarkRelist(b *testing.B) {
	for _, n := range []int{100, 1_000, 30_000} {
		for _, kind := range []string{"steady", "first"} {
			b.Run(fmt.Sprintf("containers=%d/runtime=fake/relist=%s", n, kind), func(b *testing.B) {
				benchmarkRelist(b, n, kind)
			})
		}
	}
}

func benchmarkRelist(b *testing.B, containers int, kind string) {
	first := kind == "first"
	fake := generatortest.NewFakeRuntime(crisim.Options{})
	// The kubelet's labels and annotations, so that a listing is as large
	// as on a real node.
	if err := fake.Model().PopulateKubelet(containers/benchContainersPerPod, containers); err != nil {
		b.Fatal(err)
	}
	// One set of metrics for every generator: relist=first makes one per
	// relist, and building metrics is no part of a relist.
	m, err := generator.NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	opts := generator.Options{Logger: slog.New(slog.DiscardHandler), Metrics: m}
	ctx := b.Context()
	sink := &countingSink{}
	g := generator.New(fake, sink, opts)
	if err := g.Relist(ctx); err != nil { // checks the setup
		b.Fatal(err)
	}
	if want := containers + containers/benchContainersPerPod; sink.events != want {
		b.Fatalf("first relist sent %d events, want %d (a ContainerStarted per container and sandbox)", sink.events, want)
	}
	b.ReportAllocs()
	for b.Loop() {
		if first {
			g = generator.New(fake, sink, opts)
		}
		if err := g.Relist(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(containers), "ns/container")
}

// countingSink is a generator.Sink that only counts: a relist benchmark must
// not grow a slice of every event it ever produced.
type countingSink struct{ events int }

func (s *countingSink) Send(_ context.Context, events []generator.Event) error {
	s.events += len(events)
	return nil
}
