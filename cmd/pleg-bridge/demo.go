package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"golang.org/x/sync/errgroup"
)

// demoConfig is the bridge configuration of the demo: the defaults, with the
// PLEG_* tuning variables honoured (PLEG_MODE=generic, say). Where things
// are (NATS, the runtime, the data, the node name) is the demo's own.
func demoConfig(lookup lookupFunc) (Config, error) {
	c, err := loadConfig(lookup)
	if err != nil {
		return c, fmt.Errorf("invalid configuration:\n%w", err)
	}
	c.NodeName = "demo-node"
	c.NATSURL, c.CRIEndpoint, c.ListenAddress = "", "", ""
	c.DataDir = "" // set to the demo's temporary directory
	return c, nil
}

// runDemo runs the product end to end on embedded parts: an in-process NATS
// server with JetStream, the simulated CRI runtime on a unix socket with pod
// churn, the bridge between them, and a JetStream subscriber that prints
// every event as it arrives.
func runDemo(ctx context.Context, args []string, lookup lookupFunc, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	rate := fs.Float64("rate", 1, "pods the simulated runtime starts per second")
	lifetime := fs.Duration("lifetime", 4*time.Second, "how long each simulated pod's containers run")
	containers := fs.Int("containers", 2, "containers per simulated pod")
	listen := fs.String("nats-listen", "127.0.0.1:4222", "listen address of the embedded NATS server (a random port if it is taken)")
	metrics := fs.String("listen", "", "serve /metrics, /healthz and /readyz on this address (empty: off)")
	var logLevel slog.Level
	fs.TextVar(&logLevel, "log-level", slog.LevelWarn, "log level of the bridge: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("demo: unexpected arguments %q", fs.Args())
	}
	if *rate <= 0 {
		return fmt.Errorf("demo: --rate=%v must be positive", *rate)
	}
	cfg, err := demoConfig(lookup)
	if err != nil {
		return err
	}
	cfg.ListenAddress = *metrics
	logger := newLogger(stderr, logAuto, logLevel)
	if *duration > 0 {
		// A cancel after the duration, not a deadline: gRPC would send a
		// deadline to the runtime with every call, and the runtime's side,
		// which expires first, would end the calls as failures just before
		// the demo stops.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := time.AfterFunc(*duration, cancel)
		defer stop.Stop()
	}
	dir, err := os.MkdirTemp("", "pleg-bridge-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.DataDir = dir

	ns, err := startEmbeddedNATS(*listen, dir, logger)
	if err != nil {
		logger.Warn("embedded NATS cannot listen where asked, using a random port", "listen", *listen, "err", err)
		if ns, err = startEmbeddedNATS("127.0.0.1:-1", dir, logger); err != nil {
			return err
		}
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	nc, err := nats.Connect(ns.ClientURL(), nats.Name("pleg-bridge demo"))
	if err != nil {
		return fmt.Errorf("connect to the embedded NATS server: %w", err)
	}
	defer nc.Close()

	model := crisim.NewRuntime(crisim.Containerd24Options())
	sock := filepath.Join(dir, "cri.sock")
	lis, err := crisim.Listen(sock)
	if err != nil {
		return err
	}
	sim := crisim.NewServer(model, crisim.ServerOptions{})
	cri, err := generator.NewCRIClient("unix://"+sock, generator.CRIOptions{})
	if err != nil {
		return err
	}
	defer cri.Close()
	b, err := newBridge(cfg, cri, nc, logger)
	if err != nil {
		return err
	}

	// The subscriber needs the stream; the bridge would create it too.
	if err := ensureStream(ctx, b.js, cfg, logger); err != nil {
		return err
	}
	printDemoBanner(stdout, cfg, ns, sock, *rate, *containers)
	counts := &eventCounts{}
	eg, gctx := errgroup.WithContext(ctx)
	simCtx, stopSim := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSim()
	eg.Go(func() error { return sim.Serve(simCtx, lis) })
	eg.Go(func() error {
		defer stopSim() // the runtime outlives the bridge that reads it
		return b.Run(gctx)
	})
	eg.Go(func() error {
		return crisim.Churn(gctx, model, crisim.ChurnOptions{
			PodsPerSecond: *rate, ContainersPerPod: *containers, Lifetime: *lifetime, Namespace: "demo", Seed: time.Now().UnixNano(),
		})
	})
	eg.Go(func() error {
		return subscribeAndPrint(gctx, nc, cfg, stdout, counts)
	})
	err = eg.Wait()
	fmt.Fprintf(stdout, "\n%s\n", counts)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

func printDemoBanner(w io.Writer, cfg Config, ns *server.Server, sock string, rate float64, containers int) {
	fmt.Fprintf(w, `pleg-bridge demo
  runtime   simulated containerd 2.4 on %s, starting %.3g pods/s with %d containers each
  bridge    node %q, mode %s, relist every %v
  NATS      embedded JetStream at %s, stream %s, subjects %s.>
  watch     in another terminal: go run ./cmd/pleg-bridge tail --nats-url %s
            or the nats CLI:     nats --server %s sub '%s.>'
  Ctrl-C stops the demo.

`, sock, rate, containers, cfg.NodeName, cfg.Mode, cfg.RelistPeriod, ns.ClientURL(), cfg.Stream, cfg.SubjectPrefix,
		ns.ClientURL(), ns.ClientURL(), cfg.SubjectPrefix)
}

// subscribeAndPrint follows the stream as any downstream subscriber would and
// prints one line per event.
func subscribeAndPrint(ctx context.Context, nc *nats.Conn, cfg Config, w io.Writer, counts *eventCounts) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	err = consumer.Subscribe(ctx, js, consumer.Options{Stream: cfg.Stream, SubjectPrefix: cfg.SubjectPrefix, DeliverAll: true,
		OnError: func(err error) { fmt.Fprintf(w, "undecodable message: %v\n", err) },
	}, func(e consumer.Event) error {
		counts.add(e.LifecycleType())
		_, err := fmt.Fprintln(w, consumer.Format(e))
		return err
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

type eventCounts struct {
	mu sync.Mutex
	n  map[string]int // guarded by mu
}

func (c *eventCounts) add(t string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[t]++
}

func (c *eventCounts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("received %d ContainerStarted, %d ContainerDied, %d ContainerRemoved",
		c.n["ContainerStarted"], c.n["ContainerDied"], c.n["ContainerRemoved"])
}
