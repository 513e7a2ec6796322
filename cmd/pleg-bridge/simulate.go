package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"golang.org/x/sync/errgroup"
)

// runSimulate serves the simulated CRI runtime on a unix socket, with
// optional pod churn: for docker-compose and for trying the bridge on a
// machine without containerd.
func runSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "/run/pleg-sim/cri.sock", "unix socket to serve the CRI RuntimeService on")
	rate := fs.Float64("rate", 1, "pods started per second (0: no churn)")
	lifetime := fs.Duration("lifetime", 10*time.Second, "how long each pod's containers run")
	containers := fs.Int("containers", 2, "containers per pod")
	behave := fs.String("behave-like", "containerd-2.4", "runtime behaviour to imitate: containerd-2.4 or containerd-1.7")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var opts crisim.Options
	switch *behave {
	case "containerd-2.4":
		opts = crisim.Containerd24Options()
	case "containerd-1.7":
		opts = crisim.Containerd17Options()
	default:
		return fmt.Errorf("simulate: --behave-like=%q: want containerd-2.4 or containerd-1.7", *behave)
	}
	if *rate < 0 {
		return fmt.Errorf("simulate: --rate=%v must not be negative", *rate)
	}
	model := crisim.NewRuntime(opts)
	lis, err := crisim.Listen(*socket)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "simulated CRI runtime (%s) serving on unix://%s, %.3g pods/s\n", *behave, *socket, *rate)
	eg, gctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return crisim.NewServer(model, crisim.ServerOptions{}).Serve(gctx, lis) })
	if *rate > 0 {
		eg.Go(func() error {
			return crisim.Churn(gctx, model, crisim.ChurnOptions{PodsPerSecond: *rate, ContainersPerPod: *containers, Lifetime: *lifetime, Namespace: "sim"})
		})
	}
	return eg.Wait()
}
