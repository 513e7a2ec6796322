package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/gctune"
)

// childEnv carries a child's spec (JSON) when pleg-bench re-executes itself
// as one of the processes it measures (see maybeRunChild).
const childEnv = "PLEG_BENCH_CHILD"

// The roles of a child process.
const (
	roleRuntime = "runtime" // the simulated runtime, populated, serving CRI
	roleBridge  = "bridge"  // pleg-bridge as package bridge runs it in production
	roleBare    = "bare"    // the bare loop: ListPodSandbox + ListContainers + a diff every second
	roleEmpty   = "empty"   // a Go process that does nothing: the floor of the others
	roleRaw     = "raw"     // the throughput baseline: decode the runtime's stream, publish a message per transition
)

// childSpec says what a child process is.
type childSpec struct {
	Role       string
	Socket     string         // the runtime's CRI socket
	Pods       int            // roleRuntime: the population
	Containers int            // roleRuntime
	Mode       generator.Mode // roleBridge
	NATSURL    string         // roleBridge
	DataDir    string         // roleBridge; empty: no durable state
	Node       string         // roleBridge
	Period     time.Duration  // roleBare: the loop's period
	// EventBuffer is, for roleRuntime, the events it buffers for each
	// subscriber before it drops it as too slow; 0 means crisim's default.
	EventBuffer int
	// roleRuntime: once asked for its stats the first time, churn pods at
	// ChurnPodsPerSecond (0: none), ChurnContainers each, each living
	// ChurnLifetime, for ChurnFor.
	ChurnPodsPerSecond float64
	ChurnContainers    int
	ChurnLifetime      time.Duration
	ChurnFor           time.Duration
}

// childStats is what a child reports of itself, as the kernel counts it.
type childStats struct {
	CPU    time.Duration // user + system, all threads, since the start
	MaxRSS int64         // peak resident set size, bytes
	// Switches counts the context switches of all threads, voluntary and
	// not: a thread that blocks and is woken again counts one.
	Switches int64
	// Syscalls counts the read and write system calls (Linux: syscr +
	// syscw of /proc/self/io; 0 elsewhere): a message written on its own
	// counts one, a burst written together one.
	Syscalls int64
	// DiskWritten counts the bytes the process caused to be written to
	// storage (Linux: write_bytes of /proc/self/io; 0 elsewhere): the
	// durable store's writes.
	DiskWritten int64
	// Allocated is the heap this process allocated since its start, in
	// bytes (runtime/metrics): unlike CPU time, it does not move with the
	// machine's load, and the garbage collector's work follows it.
	Allocated uint64
	// Events is, for roleBare, the changes its diffs found; for
	// roleRuntime, the Lifecycle transitions it made (CRI events other
	// than CREATED); for roleRaw, the messages JetStream acked.
	Events int
	// Pending is, for roleBridge, the events not acked yet.
	Pending int
	// Churning is, for roleRuntime, true until its churn is over.
	Churning bool
}

// maybeRunChild runs this process as the child its environment names, and
// exits; without childEnv it returns at once. A child writes "ready" on its
// stdout once it is in its steady state, then answers every line on its
// stdin with its childStats as JSON, and stops when stdin ends.
func maybeRunChild() {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	signal.Ignore(os.Interrupt) // the parent decides when a child stops
	if err := runChild(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pleg-bench child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(specJSON string, stdin io.Reader, stdout io.Writer) error {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("read %s: %w", childEnv, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var events func() int
	var extra func(*childStats) // adds what the role reports
	done := make(chan error, 1)
	ready := make(chan struct{})
	switch spec.Role {
	case roleRuntime:
		opts := crisim.Containerd24Options()
		opts.EventBuffer = spec.EventBuffer
		model := crisim.NewRuntime(opts)
		if err := model.PopulateKubelet(spec.Pods, spec.Containers); err != nil {
			return err
		}
		lis, err := crisim.Listen(spec.Socket)
		if err != nil {
			return err
		}
		go func() { done <- crisim.NewServer(model, crisim.ServerOptions{}).Serve(ctx, lis) }()
		close(ready)
		if spec.ChurnPodsPerSecond > 0 {
			var churned sync.WaitGroup
			defer churned.Wait()
			churnDone := make(chan struct{})
			start := sync.OnceFunc(func() {
				churned.Go(func() {
					defer close(churnDone)
					cctx, cancel := context.WithTimeout(ctx, spec.ChurnFor)
					defer cancel()
					if err := crisim.Churn(cctx, model, crisim.ChurnOptions{
						PodsPerSecond: spec.ChurnPodsPerSecond, ContainersPerPod: spec.ChurnContainers, Lifetime: spec.ChurnLifetime,
					}); err != nil {
						fmt.Fprintln(os.Stderr, "pleg-bench runtime: churn:", err)
					}
				})
			})
			extra = func(st *childStats) {
				start()
				s := model.Stats()
				st.Events = s.Events - s.SandboxesCreated - s.ContainersCreated
				select {
				case <-churnDone:
				default:
					st.Churning = true
				}
			}
		}
	case roleBridge:
		// Tuned as the agent tunes its process (cmd/pleg-bridge run).
		gc := gctune.Start(spec.Mode)
		defer gc.Stop()
		b, err := bridge.New(bridge.Options{
			StartupOver:   gc.StartupOver,
			Node:          spec.Node,
			CRIEndpoint:   "unix://" + spec.Socket,
			Mode:          spec.Mode,
			NATS:          bridge.NATSOptions{URL: spec.NATSURL},
			Stream:        bridge.StreamOptions{Manage: true},
			DataDir:       spec.DataDir,
			SpoolMaxBytes: bridge.DefaultSpoolMaxBytes,
			ListenAddress: "127.0.0.1:0",
			Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			return err
		}
		go func() { done <- b.Run(ctx) }()
		extra = func(st *childStats) { st.Pending = b.Status().Pending }
		go func() {
			// The bridge offers no signal to wait on; this is outside the
			// measurement.
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			for range t.C {
				if s := b.Status(); s.Synced && s.Pending == 0 {
					close(ready)
					return
				}
			}
		}()
	case roleBare:
		n := 0
		loop, err := newBareLoop(spec.Socket)
		if err != nil {
			return err
		}
		defer loop.close()
		if _, err := loop.relist(ctx); err != nil { // everything is new
			return err
		}
		close(ready)
		// The loop's goroutine owns n: it answers what it counted on stats.
		stats := make(chan chan int)
		events = func() int { c := make(chan int); stats <- c; return <-c }
		go func() { done <- loop.run(ctx, spec.Period, &n, stats) }()
	case roleRaw:
		raw, err := newRawPublisher(ctx, spec)
		if err != nil {
			return err
		}
		defer raw.close()
		go func() { done <- raw.run(ctx) }()
		close(ready)
		extra = func(st *childStats) { st.Events = raw.acked() }
	case roleEmpty:
		close(ready)
	default:
		return fmt.Errorf("unknown role %q", spec.Role)
	}
	select {
	case <-ready:
	case err := <-done:
		return fmt.Errorf("%s ended before it was ready: %w", spec.Role, err)
	}
	if dir := os.Getenv(profileEnv); dir != "" && (spec.Role != roleRuntime || spec.ChurnPodsPerSecond > 0) {
		stop, err := startProfiles(filepath.Join(dir, profileName(spec)))
		if err != nil {
			return err
		}
		defer stop()
	}
	fmt.Fprintln(stdout, "ready")
	in := bufio.NewScanner(stdin)
	enc := json.NewEncoder(stdout)
	for in.Scan() {
		st := selfStats()
		if events != nil {
			st.Events = events()
		}
		if extra != nil {
			extra(&st)
		}
		if err := enc.Encode(st); err != nil {
			return err
		}
	}
	cancel()
	if spec.Role == roleEmpty {
		return nil
	}
	if spec.Role == roleRaw {
		// Its stream ends with the runtime, which may stop later.
		return nil
	}
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// heapAllocated returns the bytes this process allocated on the heap since
// its start.
func heapAllocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// bareLoop is the baseline of a relist: what any program that follows a
// node's containers over CRI must do at least, with the generated client
// as it comes.
type bareLoop struct {
	conn *grpc.ClientConn
	cli  runtimeapi.RuntimeServiceClient
	prev map[string]int32 // state by sandbox or container ID
}

func newBareLoop(socket string) (*bareLoop, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cri.DefaultMaxRecvMsgSize)))
	if err != nil {
		return nil, err
	}
	return &bareLoop{conn: conn, cli: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

func (l *bareLoop) close() { l.conn.Close() }

// relist lists the node and returns how many sandboxes and containers
// changed state, appeared or went since the last call.
func (l *bareLoop) relist(ctx context.Context) (int, error) {
	sbs, err := l.cli.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, err
	}
	cs, err := l.cli.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return 0, err
	}
	cur := make(map[string]int32, len(sbs.GetItems())+len(cs.GetContainers()))
	for _, sb := range sbs.GetItems() {
		cur[sb.GetId()] = int32(sb.GetState())
	}
	for _, c := range cs.GetContainers() {
		cur[c.GetId()] = int32(c.GetState())
	}
	changed := 0
	for id, st := range cur {
		if old, ok := l.prev[id]; !ok || old != st {
			changed++
		}
	}
	for id := range l.prev {
		if _, ok := cur[id]; !ok {
			changed++
		}
	}
	l.prev = cur
	return changed, nil
}

// run relists every period until ctx is done, adding what changed to *n,
// and answers each channel received on stats with *n.
func (l *bareLoop) run(ctx context.Context, period time.Duration, n *int, stats chan chan int) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case c := <-stats:
			c <- *n
		case <-t.C:
			d, err := l.relist(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err() // stopped during a relist
				}
				return err
			}
			*n += d
		}
	}
}

// profileEnv names a directory where each child writes a CPU profile from
// the moment it is ready (its steady state) and an allocation profile of
// its whole life at its end, as <role>-<mode>-<pid>.{cpu,heap}.pprof
// (runtime-<pid>.{cpu,heap}.pprof for the runtime). A runtime is profiled
// only when it churns (the throughput rows): that is when its own speed is
// part of the measurement, while an idle one only serves the relists. The
// latency rows, whose bridge runs in this process, are recorded there with
// runtime/trace instead (latencybench.Config.TraceDir).
const profileEnv = "PLEG_BENCH_PROFILE"

// profileName is the name, less its suffix, of the profiles of the child
// spec describes.
func profileName(spec childSpec) string {
	if spec.Role == roleRuntime {
		return fmt.Sprintf("%s-%d", spec.Role, os.Getpid())
	}
	return fmt.Sprintf("%s-%s-%d", spec.Role, spec.Mode, os.Getpid())
}

func startProfiles(prefix string) (stop func(), err error) {
	f, err := os.Create(prefix + ".cpu.pprof")
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if h, err := os.Create(prefix + ".heap.pprof"); err == nil {
			pprof.Lookup("allocs").WriteTo(h, 0)
			h.Close()
		}
	}, nil
}
