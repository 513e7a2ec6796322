package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// measureRelist measures, for each node size, one full relist as the
// generator does it through its CRI client, against the bare List round
// trip (ListPodSandbox and ListContainers with the generated client, as
// any program that follows the node must at least do), both against the
// simulated runtime in a process of its own, so that only the client's
// side is counted: steady (nothing changed since the last relist, so it
// comes back unchanged and merges nothing, as on a quiet node), steady with
// every pod merged (as when anything else was merged since the last relist:
// a stream message, a targeted relist) and first (an empty cache: a status
// call and an event per container). Each figure is a testing.Benchmark of
// about a second, reps times.
func measureRelist(ctx context.Context, sizes []nodeSize, reps int, progress io.Writer) ([]measurement, error) {
	var rows []measurement
	for _, size := range sizes {
		r, err := measureRelistOf(ctx, size, reps)
		if err != nil {
			return nil, fmt.Errorf("relist %s: %w", size, err)
		}
		fmt.Fprintf(progress, "relist %s measured\n", size)
		rows = append(rows, r...)
	}
	return rows, nil
}

func measureRelistOf(ctx context.Context, size nodeSize, reps int) (_ []measurement, err error) {
	dir, err := os.MkdirTemp("", "pleg-bench-relist-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	node, err := startNode(ctx, dir, "", size, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := node.close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	conn, err := grpc.NewClient("unix://"+node.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cri.DefaultMaxRecvMsgSize)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	raw := runtimeapi.NewRuntimeServiceClient(conn)
	// The steady relists' client reuses what the last listing decoded, as
	// the bridge's does once its first relist is behind it; the first
	// relists' does not, as the bridge's does not at its start.
	reusing, err := cri.NewClient("unix://"+node.socket, cri.Options{})
	if err != nil {
		return nil, err
	}
	defer reusing.Close()
	reusing.ReuseListings()
	fresh, err := cri.NewClient("unix://"+node.socket, cri.Options{})
	if err != nil {
		return nil, err
	}
	defer fresh.Close()
	// One set of metrics for every generator: first makes one per relist,
	// and building metrics is no part of a relist.
	m, err := generator.NewMetrics(nil)
	if err != nil {
		return nil, err
	}
	opts := generator.Options{Logger: slog.New(slog.DiscardHandler), Metrics: m}

	bare := func() error {
		if _, err := raw.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil {
			return err
		}
		_, err := raw.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		return err
	}
	steadyOpts := opts
	steadyOpts.Listings = reusing
	steady := generator.New(reusing, &countingSink{}, steadyOpts)
	if err := steady.Relist(ctx); err != nil {
		return nil, err
	}
	// The same client without its listing version (Options.Listings): no
	// relist comes back unchanged.
	merged := generator.New(reusing, &countingSink{}, opts)
	if err := merged.Relist(ctx); err != nil {
		return nil, err
	}
	first := func() error { return generator.New(fresh, &countingSink{}, opts).Relist(ctx) }

	type series struct{ ns, allocs, bytes []float64 }
	var bareS, steadyS, mergedS, firstS series
	for range reps {
		for _, m := range []struct {
			s  *series
			op func() error
		}{{&bareS, bare}, {&steadyS, func() error { return steady.Relist(ctx) }},
			{&mergedS, func() error { return merged.Relist(ctx) }}, {&firstS, first}} {
			r, err := benchmark(m.op)
			if err != nil {
				return nil, err
			}
			m.s.ns = append(m.s.ns, float64(r.NsPerOp())/1e6)
			m.s.allocs = append(m.s.allocs, float64(r.AllocsPerOp()))
			m.s.bytes = append(m.s.bytes, float64(r.AllocedBytesPerOp())/(1<<20))
		}
	}
	name := func(what, kind string) string { return fmt.Sprintf("relist %s, %s, %s", what, kind, size) }
	return []measurement{
		{name: name("time", "steady"), unit: milliseconds, values: steadyS.ns, baseName: "bare List", base: bareS.ns},
		{name: name("allocs", "steady"), unit: count, values: steadyS.allocs, baseName: "bare List", base: bareS.allocs},
		{name: name("bytes", "steady"), unit: mebibytesFine, values: steadyS.bytes, baseName: "bare List", base: bareS.bytes},
		{name: name("time", "steady, every pod merged"), unit: milliseconds, values: mergedS.ns, baseName: "bare List", base: bareS.ns},
		{name: name("allocs", "steady, every pod merged"), unit: count, values: mergedS.allocs, baseName: "bare List", base: bareS.allocs},
		{name: name("time", "first"), unit: milliseconds, values: firstS.ns, baseName: "bare List", base: bareS.ns},
		{name: name("bytes", "first"), unit: mebibytesFine, values: firstS.bytes, baseName: "bare List", base: bareS.bytes},
	}, nil
}

// benchmark runs op as a testing.Benchmark: for about a second.
func benchmark(op func() error) (testing.BenchmarkResult, error) {
	var runErr error
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := op(); err != nil {
				runErr = err
				b.FailNow()
			}
		}
	})
	return r, runErr
}

// countingSink is a generator.Sink that only counts events. Relist calls it
// from one goroutine.
type countingSink struct{ events int }

func (s *countingSink) Send(_ context.Context, events []generator.Event) error {
	s.events += len(events)
	return nil
}
