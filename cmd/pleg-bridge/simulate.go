package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

func newSimulateCommand(env commandEnv) *cobra.Command {
	var o simulateOptions
	c := &cobra.Command{
		Use:   "simulate",
		Short: "Serve the simulated CRI runtime on a unix socket, with pod churn",
		Long:  `For docker-compose and for trying the bridge on a machine without containerd.`,
		Example: `  pleg-bridge simulate --socket /tmp/cri.sock
  pleg-bridge simulate --socket /tmp/cri.sock --rate 0             # no churn
  pleg-bridge simulate --socket /tmp/cri.sock --behave-like containerd-1.7
  PLEG_CRI_ENDPOINT=unix:///tmp/cri.sock pleg-bridge run           # in another terminal`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runSimulate(c.Context(), c.CommandPath(), o, env.stdout)
		},
	}
	f := c.Flags()
	f.StringVar(&o.socket, "socket", "/run/pleg-sim/cri.sock", "unix socket to serve the CRI RuntimeService on")
	f.Float64Var(&o.rate, "rate", 1, "pods started per second (0: no churn)")
	f.DurationVar(&o.lifetime, "lifetime", 10*time.Second, "how long each pod's containers run")
	f.IntVar(&o.containers, "containers", 2, "containers per pod")
	f.DurationVar(&o.removeAfter, "remove-after", 2*time.Second, "how long exited containers stay before their pod is removed, as a kubelet keeps them (0: at once)")
	f.StringVar(&o.behave, "behave-like", "containerd-2.4", "runtime behaviour to imitate: containerd-2.4 or containerd-1.7")
	return c
}

// simulateOptions are the flags of simulate.
type simulateOptions struct {
	socket      string
	rate        float64
	lifetime    time.Duration
	removeAfter time.Duration
	containers  int
	behave      string
}

// runSimulate serves the simulated CRI runtime on a unix socket, with
// optional pod churn, until ctx is done.
func runSimulate(ctx context.Context, cmd string, o simulateOptions, stdout io.Writer) error {
	var opts crisim.Options
	switch o.behave {
	case "containerd-2.4":
		opts = crisim.Containerd24Options()
	case "containerd-1.7":
		opts = crisim.Containerd17Options()
	default:
		return cli.UsageErrorf(cmd, "--behave-like=%q: want containerd-2.4 or containerd-1.7", o.behave)
	}
	if o.rate < 0 {
		return cli.UsageErrorf(cmd, "--rate=%v must not be negative", o.rate)
	}
	model := crisim.NewRuntime(opts)
	// The default, /run/pleg-sim, is root's; a user names a socket in a
	// directory of theirs, which need not exist yet.
	if err := os.MkdirAll(filepath.Dir(o.socket), 0o755); err != nil {
		return fmt.Errorf("%w; pass --socket a path this user can write (e.g. /tmp/pleg-sim-$USER/cri.sock)", err)
	}
	lis, err := crisim.Listen(o.socket)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "simulated CRI runtime (%s) serving on unix://%s, %.3g pods/s\n", o.behave, o.socket, o.rate)
	eg, gctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return crisim.NewServer(model, crisim.ServerOptions{}).Serve(gctx, lis) })
	if o.rate > 0 {
		eg.Go(func() error {
			return crisim.Churn(gctx, model, crisim.ChurnOptions{PodsPerSecond: o.rate, ContainersPerPod: o.containers, Lifetime: o.lifetime,
				RemoveAfter: o.removeAfter, Namespace: "sim"})
		})
	}
	return eg.Wait()
}
