package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/bench/latencybench"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
)

// relistContainersPerPod is the pod shape of the relist table's nodes, the
// same as BenchmarkRelist's (generator/bench_test.go): a node of n
// containers has n/4 sandboxes besides them.
const relistContainersPerPod = 4

// measureRelist prints the cost of one full relist, as BenchmarkRelist
// measures it, at 100, 1,000 and 30,000 running containers: steady (nothing
// changed, no status call) and first (empty cache, a status call and an
// event per container), through the in-memory FakeRuntime and through the
// CRI client over a unix socket. Each row is a testing.Benchmark of about a
// second.
func measureRelist(ctx context.Context, w io.Writer) error {
	eventedPeriod, genericPeriod := generator.DefaultEventedRelistPeriod, generator.DefaultRelistPeriod
	fmt.Fprintf(w, "relist cost: one full relist (list, status calls, merge, events to a counting sink); pods of %d containers;\n"+
		"cpu is the process's user+system time, the simulated runtime's side of every call included;\n"+
		"the share columns are cpu/op over the evented safety-net period (%v) and the generic period (%v)\n\n",
		relistContainersPerPod, eventedPeriod, genericPeriod)
	// Fixed widths rather than a tabwriter: each row is printed as soon as it
	// is measured.
	const row = "%-10s  %-7s  %-6s  %-8s  %-8s  %-9s  %-8s  %-14s  %s\n"
	fmt.Fprintf(w, row, "containers", "runtime", "relist", "time/op", "cpu/op", "allocs/op", "bytes/op",
		"cpu share @"+eventedPeriod.String(), "cpu share @"+genericPeriod.String())
	for _, n := range []int{100, 1_000, 30_000} {
		fake := generatortest.NewFakeRuntime(crisim.Options{})
		if err := fake.Model().Populate(n/relistContainersPerPod, relistContainersPerPod); err != nil {
			return err
		}
		cri, stop, err := serveCRI(ctx, fake.Model())
		if err != nil {
			return err
		}
		for _, rt := range []struct {
			name string
			rt   generator.Runtime
		}{{"fake", fake}, {"grpc", cri}} {
			for _, first := range []bool{false, true} {
				if err := ctx.Err(); err != nil {
					stop()
					return err
				}
				c, err := relistCost(ctx, rt.rt, n, first)
				if err != nil {
					stop()
					return fmt.Errorf("relist %d containers through %s: %w", n, rt.name, err)
				}
				kind, shareE, shareG := "steady", share(c.cpu, eventedPeriod), share(c.cpu, genericPeriod)
				if first {
					kind, shareE, shareG = "first", "-", "-" // once per start, not per period
				}
				fmt.Fprintf(w, row, strconv.Itoa(n), rt.name, kind,
					latencybench.FormatDuration(c.wall), latencybench.FormatDuration(c.cpu),
					strconv.FormatInt(c.result.AllocsPerOp(), 10), formatBytes(c.result.AllocedBytesPerOp()), shareE, shareG)
			}
		}
		stop()
	}
	return nil
}

// relistCostResult is one row of the relist table.
type relistCostResult struct {
	result    testing.BenchmarkResult
	wall, cpu time.Duration // per relist; cpu is 0 where unknown
}

func relistCost(ctx context.Context, rt generator.Runtime, containers int, first bool) (relistCostResult, error) {
	opts := generator.Options{Logger: slog.New(slog.DiscardHandler), Metrics: generator.NewMetrics(nil)}
	sink := &countingSink{}
	g := generator.New(rt, sink, opts)
	if err := g.Relist(ctx); err != nil {
		return relistCostResult{}, err
	}
	if want := containers + containers/relistContainersPerPod; sink.events != want {
		return relistCostResult{}, fmt.Errorf("first relist sent %d events, want %d", sink.events, want)
	}
	var out relistCostResult
	var runErr error
	out.result = testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := cpuTime()
		for b.Loop() {
			if first {
				g = generator.New(rt, sink, opts)
			}
			if err := g.Relist(ctx); err != nil {
				runErr = err
				b.FailNow()
			}
		}
		if cpu0 > 0 {
			out.cpu = (cpuTime() - cpu0) / time.Duration(b.N)
		}
	})
	if runErr != nil {
		return relistCostResult{}, runErr
	}
	out.wall = time.Duration(out.result.NsPerOp())
	return out, nil
}

// serveCRI serves model over a unix socket in a temporary directory and
// returns a CRI client for it, and a function that closes the client and
// stops the server.
func serveCRI(ctx context.Context, model *crisim.Runtime) (*generator.CRIClient, func(), error) {
	dir, err := os.MkdirTemp("", "pleg-bench-relist-")
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(dir, "cri.sock")
	lis, err := crisim.Listen(sock)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	srvCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- crisim.NewServer(model, crisim.ServerOptions{}).Serve(srvCtx, lis) }()
	cli, err := generator.NewCRIClient("unix://"+sock, generator.CRIOptions{})
	stop := func() {
		if cli != nil {
			cli.Close()
		}
		cancel()
		<-served
		os.RemoveAll(dir)
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return cli, stop, nil
}

// countingSink is a generator.Sink that only counts events. Relist calls it
// from one goroutine.
type countingSink struct{ events int }

func (s *countingSink) Send(_ context.Context, events []generator.Event) error {
	s.events += len(events)
	return nil
}

// share prints cpu as a percentage of one core over period.
func share(cpu, period time.Duration) string {
	if cpu <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3g%%", 100*cpu.Seconds()/period.Seconds())
}

func formatBytes(n int64) string {
	switch {
	case n >= 10<<20:
		return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
	case n >= 10<<10:
		return fmt.Sprintf("%.0fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
