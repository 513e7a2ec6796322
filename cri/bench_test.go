package cri_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// benchContainersPerPod is the pod shape of the relist benchmark's nodes,
// as in package generator's: a node of n containers has n/4 pod sandboxes
// besides them.
const benchContainersPerPod = 4

// BenchmarkRelist measures one full relist through the CRI client over a
// unix socket (ListPodSandbox, ListContainers, the status calls, the merge
// into the cache and the events handed to the sink) on nodes of 100, 1,000
// and 30,000 running containers, as package generator's BenchmarkRelist
// does through its fake runtime (runtime=fake):
//
//   - relist=steady: nothing changed since the previous relist, the common
//     case: no status call, no event. The client reuses what the last
//     listing decoded, as the bridge's does once its first relist is
//     behind it, and the relist comes back unchanged and merges nothing,
//     as the bridge's on a quiet node.
//   - relist=merged: steady, but every pod is grouped and merged, as when
//     something else (a stream message, a targeted relist) was merged
//     since the last relist.
//   - relist=first: an empty cache, as after a start: a ContainerStatus call
//     and a ContainerStarted event for every container. Each op builds a new
//     Generator (sharing one Metrics, so that op is the relist and not
//     metric registration).
//
// Its ns/op and allocs also hold the in-process simulated runtime's side of
// every call (marshalling, copying the model), as a real runtime spends it
// on the same node. ns/op is the cost of one relist.
func BenchmarkRelist(b *testing.B) {
	for _, n := range []int{100, 1_000, 30_000} {
		for _, kind := range []string{"steady", "merged", "first"} {
			b.Run(fmt.Sprintf("containers=%d/runtime=grpc/relist=%s", n, kind), func(b *testing.B) {
				benchmarkRelist(b, n, kind)
			})
		}
	}
}

func benchmarkRelist(b *testing.B, containers int, kind string) {
	first := kind == "first"
	model := crisim.NewRuntime(crisim.Options{})
	// The kubelet's labels and annotations, so that a listing is as large
	// as on a real node.
	if err := model.PopulateKubelet(containers/benchContainersPerPod, containers); err != nil {
		b.Fatal(err)
	}
	// One set of metrics for every generator: relist=first makes one per
	// relist, and building metrics is no part of a relist.
	m, err := generator.NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	opts := generator.Options{Logger: slog.New(slog.DiscardHandler), Metrics: m}
	cli := benchClient(b, model)
	if !first {
		cli.ReuseListings() // as the bridge's, once its first relist is behind it
	}
	if kind != "merged" {
		// Without the client's listing version (Options.Listings), no
		// relist comes back unchanged.
		opts.Listings = cli
	}
	ctx := b.Context()
	sink := &countingSink{}
	g := generator.New(cli, sink, opts)
	if err := g.Relist(ctx); err != nil { // warms the connection, checks the setup
		b.Fatal(err)
	}
	if want := containers + containers/benchContainersPerPod; sink.events != want {
		b.Fatalf("first relist sent %d events, want %d (a ContainerStarted per container and sandbox)", sink.events, want)
	}
	b.ReportAllocs()
	for b.Loop() {
		if first {
			g = generator.New(cli, sink, opts)
		}
		if err := g.Relist(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(containers), "ns/container")
}

// benchClient serves model over a unix socket until the benchmark ends and
// returns a CRI client connected to it.
func benchClient(b *testing.B, model *crisim.Runtime) *cri.Client {
	b.Helper()
	_, endpoint := crisimtest.Serve(b, model)
	cli, err := cri.NewClient(endpoint, cri.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

// countingSink is a generator.Sink that only counts: a relist benchmark must
// not grow a slice of every event it ever produced.
type countingSink struct{ events int }

func (s *countingSink) Send(_ context.Context, events []generator.Event) error {
	s.events += len(events)
	return nil
}
