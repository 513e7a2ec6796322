package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
)

// demoLookup is the environment of the demo's bridge: the PLEG_* tuning
// variables are honoured (PLEG_MODE=generic, say), but where things are and
// how to reach them (the node, NATS and its credentials, the runtime, the
// data, the HTTP endpoint) is the demo's own, whatever the environment says.
func demoLookup(lookup lookupFunc) lookupFunc {
	return func(name string) (string, bool) {
		switch {
		case name == "PLEG_NODE_NAME":
			return "demo-node", true
		case strings.HasPrefix(name, "PLEG_NATS_"), strings.HasPrefix(name, "PLEG_CRI_ENDPOINT"),
			name == "PLEG_DATA_DIR", name == "PLEG_EMBEDDED_NATS_LISTEN", name == "PLEG_LISTEN_ADDRESS":
			return "", false
		}
		return lookup(name)
	}
}

// demoOptions are the demo's flags.
type demoOptions struct {
	duration   time.Duration
	rate       float64
	lifetime   time.Duration
	removeAt   time.Duration
	containers int
	natsListen string
	listen     string
	logLevel   slog.Level
	workloads  bool
	// natsTaken is why the embedded NATS server could not listen on
	// natsListen, when it took a random port instead.
	natsTaken error
}

func newDemoCommand(env commandEnv) *cobra.Command {
	o := demoOptions{}
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run embedded NATS, a simulated runtime with pod churn and the bridge, and print every event",
		Long: `The product end to end on embedded parts: an in-process NATS server with
JetStream, the simulated CRI runtime (containerd 2.4's behaviour) with pod
churn, the bridge between them, and a subscriber that prints every event as
it arrives. PLEG_* tuning variables apply (PLEG_MODE=generic, say); where
NATS, the runtime and the data are is the demo's own.

Beside the churn (namespace demo), the runtime runs a small cluster's
workloads, with the labels their controllers set: web and api pods that keep
running (namespaces shop and payments), two crash loops whose containers
restart with growing attempt numbers (shop/checkout-*, payments/ledger-*), a
cache that is OOMKilled and restarted (payments/cache-0), and a Job that
completes every 15s (batch/report-*). examples/crashloop reports the crash
loops within about 30s.`,
		Example: `  pleg-bridge demo
  pleg-bridge demo --rate 5 --lifetime 2s --duration 1m
  PLEG_MODE=generic pleg-bridge demo --listen 127.0.0.1:9470   # with /metrics`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if o.rate <= 0 {
				return cli.UsageErrorf(c.CommandPath(), "--rate=%v must be positive", o.rate)
			}
			return runDemo(c.Context(), o, env.lookup, env.stdout, env.stderr)
		},
	}
	f := c.Flags()
	f.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	f.Float64Var(&o.rate, "rate", 1, "pods the simulated runtime starts per second")
	f.DurationVar(&o.lifetime, "lifetime", 4*time.Second, "how long each simulated pod's containers run")
	f.IntVar(&o.containers, "containers", 2, "containers per simulated pod")
	f.DurationVar(&o.removeAt, "remove-after", time.Second, "how long exited containers stay before their pod is removed, as a kubelet keeps them (0: at once)")
	f.StringVar(&o.natsListen, "nats-listen", "127.0.0.1:4222", "listen address of the embedded NATS server (a random port if it is taken)")
	f.StringVar(&o.listen, "listen", "", "serve /metrics, /healthz and /readyz on this address (empty: off)")
	o.logLevel = slog.LevelWarn
	f.TextVar(&o.logLevel, "log-level", o.logLevel, "log level of the bridge: debug, info, warn or error")
	f.BoolVar(&o.workloads, "workloads", true, "run the crash loops, the OOMKilled cache, the Jobs and the long-running pods beside the churn")
	return c
}

// runDemo runs the product end to end on embedded parts: an in-process NATS
// server with JetStream, the simulated CRI runtime on a unix socket with pod
// churn, the bridge between them, and a JetStream subscriber that prints
// every event as it arrives.
func runDemo(ctx context.Context, o demoOptions, lookup lookupFunc, stdout, stderr io.Writer) error {
	host, port, err := natsembed.SplitListen(o.natsListen)
	if err != nil {
		return fmt.Errorf("demo: --nats-listen: %w", err)
	}
	cfg, err := loadConfig(demoLookup(lookup))
	if err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	logger := cli.NewLogger(stderr, logAuto, o.logLevel)
	if o.duration > 0 {
		// A cancel after the duration, not a deadline: gRPC would send a
		// deadline to the runtime with every call, and the runtime's side,
		// which expires first, would end the calls as failures just before
		// the demo stops.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := time.AfterFunc(o.duration, cancel)
		defer stop.Stop()
	}
	if o.listen != "" {
		// The bridge binds it only once it runs, after the banner; a taken
		// address is said first, naming the flag.
		lis, err := net.Listen("tcp", o.listen)
		if err != nil {
			return fmt.Errorf("demo: --listen %s: %w; pass a free address, or none for no metrics endpoint", o.listen, err)
		}
		lis.Close()
	}
	dir, err := os.MkdirTemp("", "pleg-bridge-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// The demo runs the NATS server itself, rather than the bridge's
	// embedded one: its subscriber and its banner need the URL, and a port
	// that is taken falls back to a random one.
	store := filepath.Join(dir, "nats")
	ns, err := natsembed.Start(natsembed.Options{DataDir: store, Host: host, Port: port, ServerName: "pleg-bridge-demo"})
	if err != nil {
		// The banner says so, with the URL to use instead.
		o.natsTaken = err
		if ns, err = natsembed.Start(natsembed.Options{DataDir: store, Host: host, Port: -1, ServerName: "pleg-bridge-demo"}); err != nil {
			return err
		}
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	nc, err := nats.Connect(ns.ClientURL(), nats.Name("pleg-bridge demo subscriber"))
	if err != nil {
		return fmt.Errorf("connect to the embedded NATS server: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("create JetStream context: %w", err)
	}

	model := crisim.NewRuntime(crisim.Containerd24Options())
	sock := filepath.Join(dir, "cri.sock")
	lis, err := crisim.Listen(sock)
	if err != nil {
		return err
	}
	sim := crisim.NewServer(model, crisim.ServerOptions{})

	cfg.NATSURL, cfg.CRIEndpoint, cfg.DataDir, cfg.ListenAddress = ns.ClientURL(), "unix://"+sock, dir, o.listen
	opts := cfg.bridgeOptions(logger, nil)
	b, err := bridge.New(opts)
	if err != nil {
		lis.Close()
		return err
	}
	// The subscriber needs the stream; the bridge would create it too.
	if err := bridge.EnsureStream(ctx, js, opts); err != nil {
		lis.Close()
		return err
	}
	printDemoBanner(stdout, cfg, ns, sock, o)
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
			PodsPerSecond: o.rate, ContainersPerPod: o.containers, Lifetime: o.lifetime, RemoveAfter: o.removeAt,
			Namespace: "demo", Seed: time.Now().UnixNano(),
		})
	})
	if o.workloads {
		eg.Go(func() error {
			return crisim.Workloads(gctx, model, crisim.WorkloadsOptions{Seed: time.Now().UnixNano()})
		})
	}
	eg.Go(func() error {
		return subscribeAndPrint(gctx, js, cfg, stdout, counts)
	})
	err = eg.Wait()
	fmt.Fprintf(stdout, "\n%s\n", counts)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

func printDemoBanner(w io.Writer, cfg Config, ns *server.Server, sock string, o demoOptions) {
	url := ns.ClientURL()
	fmt.Fprintf(w, `pleg-bridge demo
  runtime   simulated containerd 2.4 on %s, starting %.3g pods/s with %d containers each in namespace demo
`, sock, o.rate, o.containers)
	if o.workloads {
		fmt.Fprint(w, `  workloads crash loops shop/checkout-* and payments/ledger-*, OOMKilled payments/cache-0,
            a Job batch/report-* every 15s, running shop/web-* and payments/api-*
`)
	}
	taken := ""
	if o.natsTaken != nil {
		taken = fmt.Sprintf(" (--nats-listen %s: %v)", o.natsListen, o.natsTaken)
	}
	fmt.Fprintf(w, `  bridge    node %q, %s
  NATS      embedded JetStream at %s%s, stream %s, subjects %s.>
  watch     in another terminal: go run ./cmd/pleg-bridge tail --nats-url %s
            or the nats CLI:     nats --server %s sub '%s.>'
  state     go run ./cmd/pleg-bridge ps --all --watch --nats-url %s --bucket %s
`, cfg.NodeName, demoRelists(cfg), url, taken, cfg.Stream, cfg.SubjectPrefix,
		url, url, cfg.SubjectPrefix, url, cfg.StateBucket)
	if o.workloads {
		fmt.Fprintf(w, "  crashes   go run ./examples/crashloop -nats-url %s\n", url)
	}
	fmt.Fprint(w, "  Ctrl-C stops the demo.\n\n")
}

// demoRelists says how the bridge of cfg relists: every RelistPeriod in
// generic mode; else every EventedRelistPeriod as a safety net under the
// event stream, and every RelistPeriod while the stream fails.
func demoRelists(cfg Config) string {
	if cfg.Mode == generator.ModeGeneric {
		return fmt.Sprintf("mode generic, relist every %v", cfg.RelistPeriod)
	}
	return fmt.Sprintf("mode %s, relist every %v under the event stream (every %v while it fails)", cfg.Mode, cfg.EventedRelistPeriod, cfg.RelistPeriod)
}

// subscribeAndPrint follows the stream as any downstream subscriber would and
// prints one line per event.
func subscribeAndPrint(ctx context.Context, js jetstream.JetStream, cfg Config, w io.Writer, counts *eventCounts) error {
	err := consumer.Subscribe(ctx, js, consumer.Options{Stream: cfg.Stream, SubjectPrefix: cfg.SubjectPrefix, DeliverAll: true,
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
