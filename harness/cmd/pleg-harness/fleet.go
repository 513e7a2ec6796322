package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/harness/fleet"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

func newFleetCommand(env commandEnv) *cobra.Command {
	var (
		o        fleet.Options
		faults   string
		logLevel = slog.LevelWarn
	)
	o.BridgeLogLevel = slog.LevelWarn
	c := &cobra.Command{
		Use:   "fleet",
		Short: "Run many simulated nodes' bridges against a 3-server JetStream cluster, with faults, and account for every transition",
		Long: fmt.Sprintf(`Each simulated node has its own runtime (crisim, kubelet-like pods and a
share of the churn) and its own bridge (package bridge: its own NATS
connection and data directory); the bridges run in a few processes, the
three NATS servers in one process each, all of them this binary. Faults are
injected on a schedule; at the end every transition is accounted for per
fault window (missing, duplicated, out of order), with the servers' peak
memory and CPU, the stream's subjects and bytes, the state bucket's keys
and the time each fault took to drain. It exits non-zero on any loss.
docs/measurements.md says what the figures mean. Faults:
  %s`, strings.Join(fleet.AllFaults, ", ")),
		Example: `  pleg-harness fleet --nodes 50 --duration 30s --faults server-restart    # the CI run
  pleg-harness fleet --nodes 200 --duration 5m --outage 60s
  pleg-harness fleet --nodes 1000 --procs 10 --duration 10m --faults all`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runFleet(c.Context(), o, faults, logLevel, env.stdout, env.stderr)
		},
	}
	f := c.Flags()
	f.IntVar(&o.Nodes, "nodes", fleet.DefaultNodes, "simulated nodes, one bridge each")
	f.IntVar(&o.Procs, "procs", fleet.DefaultProcs, "processes the bridges are spread over (a bridge kill kills whole processes)")
	f.IntVar(&o.Pods, "pods", fleet.DefaultPods, "kubelet-like pods each node runs from the start (-1: none)")
	f.IntVar(&o.ContainersPerPod, "containers", fleet.DefaultContainersPerPod, "containers per pod")
	f.Float64Var(&o.Rate, "rate", 0, "fleet-wide churn in transitions per second (0: 0.5 per node)")
	f.DurationVar(&o.Lifetime, "lifetime", fleet.DefaultLifetime, "how long a churned pod's containers run, give or take 50%")
	f.DurationVar(&o.Duration, "duration", fleet.DefaultDuration, "how long the churn runs, faults included")
	f.StringVar(&faults, "faults", "", `faults to inject, comma-separated, "all" or "none" (default: server-restart,cluster-down,bridge-kill)`)
	f.DurationVar(&o.Outage, "outage", fleet.DefaultOutage, "how long cluster-down keeps every server down")
	f.Float64Var(&o.KillFraction, "kill-fraction", fleet.DefaultKillFraction, "share of the bridge processes bridge-kill kills, rounded up")
	f.Float64Var(&o.RolloutFraction, "rollout-fraction", fleet.DefaultRolloutFraction, "share of the fleet's pods rolling-deploy replaces, rounded up")
	f.DurationVar(&o.RolloutSpan, "rollout-span", fleet.DefaultRolloutSpan, "how long rolling-deploy takes to replace them")
	f.IntVar(&o.DrainNodes, "drain-nodes", fleet.DefaultDrainNodes, "nodes node-drain drains of their pods (their replacements start on the other nodes)")
	f.DurationVar(&o.DrainSpan, "drain-span", fleet.DefaultDrainSpan, "how long node-drain takes to end the drained nodes' pods and start their replacements")
	f.DurationVar(&o.FaultLength, "fault-length", fleet.DefaultFaultLength, "how long killed bridge processes stay down")
	f.DurationVar(&o.Rollback, "rollback", fleet.DefaultRollback, "how far back power-loss and os-crash roll a server's store: what it acknowledged in that time is lost")
	f.BoolVar(&o.NoRepair, "no-repair", false, "run the bridges without their repair of what the servers lost, to see the loss it prevents")
	f.StringVar(&o.SyncInterval, "sync-interval", "", `the servers' JetStream sync_interval: "always" or a duration (default: nats-server's, 2m)`)
	f.DurationVar(&o.DrainTimeout, "drain-timeout", fleet.DefaultDrainTimeout, "how long every node may take to have nothing pending after a fault")
	f.DurationVar(&o.SettleTimeout, "settle-timeout", fleet.DefaultSettleTimeout, "how long to wait at the end for the stream to hold every transition")
	f.Uint64Var(&o.Seed, "seed", 0, "seed of the churn (0: from the clock)")
	f.StringVar(&o.Dir, "dir", "", "run directory: sockets, NATS stores, bridge data and every process's log (default: a new temporary directory, removed if the run passes)")
	f.TextVar(&o.BridgeLogLevel, "bridge-log-level", o.BridgeLogLevel, "log level of the bridges (their logs: <dir>/bridges/bridges-<i>.log)")
	f.TextVar(&logLevel, "log-level", logLevel, "log level of the harness's own diagnostics: debug, info, warn or error")
	c.AddCommand(newFleetChildCommand(env), newFleetSubjectsCommand(env))
	return c
}

// newFleetChildCommand is the hidden command the fleet re-executes this
// binary with, for its servers and bridge processes; the spec is in the
// environment (fleet.ChildEnv).
func newFleetChildCommand(env commandEnv) *cobra.Command {
	return &cobra.Command{
		Use:    "child",
		Short:  "Run one process of a fleet (started by pleg-harness fleet)",
		Hidden: true,
		Args:   cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			spec := env.getenv(fleet.ChildEnv)
			if spec == "" {
				return cli.UsageErrorf(c.CommandPath(), "%s is not set: this command is started by pleg-harness fleet", fleet.ChildEnv)
			}
			return fleet.RunChild(c.Context(), spec, c.InOrStdin(), env.stdout, env.stderr)
		},
	}
}

// runFleet is the fleet subcommand. It fails if any transition was lost,
// duplicated or reordered.
func runFleet(ctx context.Context, o fleet.Options, faults string, logLevel slog.Level, stdout, stderr io.Writer) error {
	switch faults {
	case "":
	case "all":
		o.Faults = fleet.AllFaults
	case "none":
		o.Faults = []string{}
	default:
		o.Faults = strings.Split(faults, ",")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("fleet: find this binary to run the servers and bridges: %w", err)
	}
	o.ChildCommand = []string{self, "fleet", "child"}
	temporary := o.Dir == ""
	if temporary {
		if o.Dir, err = os.MkdirTemp("", "pleg-fleet-"); err != nil {
			return fmt.Errorf("fleet: %w", err)
		}
	}
	o.Logger = cli.NewLogger(stderr, cli.LogAuto, logLevel)
	o.Stdout = stdout

	rep, err := fleet.Run(ctx, o)
	if err != nil {
		return fmt.Errorf("fleet (run directory %s): %w", o.Dir, err)
	}
	fmt.Fprintln(stdout)
	if err := rep.Table(stdout); err != nil {
		return err
	}
	if rep.Failed() {
		return fmt.Errorf("fleet failed: %d missing, %d duplicated, %d out of order, %d unexpected, %d problems; the logs are in %s",
			rep.Total.Missing, rep.Total.Duplicated, rep.Total.OutOfOrder, len(rep.Unexpected)+len(rep.Undecodable), len(rep.Problems), o.Dir)
	}
	if temporary {
		return os.RemoveAll(o.Dir)
	}
	return nil
}
