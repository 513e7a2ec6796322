package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/harness/soak"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

func newSoakCommand(env commandEnv) *cobra.Command {
	return soakCommand(env, &soakFlags{logLevel: slog.LevelWarn})
}

// soakFlags are the soak command's flags; options turns them into
// soak.Options.
type soakFlags struct {
	o        soak.Options
	faults   string
	logLevel slog.Level
}

// options returns the soak.Options the flags ask for, before the run
// directory and the bridge binary are set.
func (f *soakFlags) options() soak.Options {
	o := f.o
	switch f.faults {
	case "all":
	case "none":
		o.Faults = []string{}
	default:
		o.Faults = strings.Split(f.faults, ",")
	}
	return o
}

// soakCommand is the soak command with its flags parsed into fl.
func soakCommand(env commandEnv, fl *soakFlags) *cobra.Command {
	o := &fl.o
	c := &cobra.Command{
		Use:   "soak",
		Short: "Run churn and faults against a pleg-bridge binary and account for every transition",
		Long: fmt.Sprintf(`The simulated runtime churns pods; NATS is one server or a cluster of three;
the bridge is a pleg-bridge binary (--bridge-binary), run as a child process. Faults are injected on a
schedule, and every transition the runtime made is accounted for: expected,
found, missing, duplicated and out of order, per fault window. It exits
non-zero on any loss. The run is cut into equal windows, a baseline, one per
fault and a recovery, each long enough for its fault: a short --duration
takes fewer --faults (its error says which fit). Faults:
  %s`, strings.Join(soak.AllFaults, ", ")),
		Example: `  pleg-harness soak                                   # 5 minutes, one NATS server, every fault
  pleg-harness soak --cluster                         # a 3-server NATS cluster, stream replicas 3
  pleg-harness soak --duration 1m --faults none --rate 50
  pleg-harness soak --duration 1m --faults bridge-kill,stream-drop
  pleg-harness soak --faults nats-outage --bridge-env PLEG_MODE=generic --dir /tmp/soak
  pleg-harness soak --prometheus                      # and a real Prometheus and Alertmanager: each fault fires its alerts
  pleg-harness soak --prometheus --faults none --duration 10m   # nothing may fire`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			o := fl.options()
			if o.Prometheus && !c.Flags().Changed("outbox") {
				o.OutboxSize = 0 // the soak's default with Prometheus
			}
			if o.Prometheus {
				var err error
				if o.PrometheusBinary, o.AlertmanagerBinary, err = soak.FindAlertingBinaries(cli.LookPathIn(env.getenv("PATH")), cacheDir(env)); err != nil {
					return fmt.Errorf("soak: %w", err)
				}
			}
			return runSoak(c.Context(), o, fl.logLevel, env)
		},
	}
	f := c.Flags()
	f.StringVar(&o.BridgeBinary, "bridge-binary", env.getenv(bridgeBinaryEnv), "the pleg-bridge binary to soak, run as \"<binary> run\" (default: $"+bridgeBinaryEnv+", which pleg-bridge soak sets to itself, else one built from this checkout by go build)")
	f.DurationVar(&o.Duration, "duration", soak.DefaultDuration, "how long the churn runs, faults included")
	f.Float64Var(&o.Rate, "rate", soak.DefaultRate, "transitions per second the churn makes")
	f.BoolVar(&o.Cluster, "cluster", false, "run a NATS cluster of three servers (stream replicas 3) instead of one server")
	f.BoolVar(&o.Containerd17, "containerd-1.7", false, "simulate containerd 1.7 (the bridge in auto mode follows containerd's own events) instead of 2.4")
	f.StringVar(&fl.faults, "faults", "all", `faults to inject, comma-separated, or "all" (the cluster-only ones only with --cluster), or "none"`)
	f.StringVar(&o.Dir, "dir", "", "run directory: sockets, NATS store, bridge data and bridge.log (default: a new temporary directory, removed if the soak passes or its flags are refused)")
	f.IntVar(&o.ContainersPerPod, "containers", soak.DefaultContainersPerPod, "containers per pod")
	f.DurationVar(&o.Lifetime, "lifetime", soak.DefaultLifetime, "how long containers run, give or take 50%")
	f.Uint64Var(&o.Seed, "seed", 0, "seed of the churn (0: from the clock)")
	f.DurationVar(&o.DuplicateWindow, "duplicate-window", soak.DefaultDuplicateWindow, "the stream's duplicate window; a NATS outage lasts twice as long")
	f.IntVar(&o.OutboxSize, "outbox", soak.DefaultOutboxSize, fmt.Sprintf("the bridge's PLEG_OUTBOX_SIZE (%d with --prometheus)", soak.AlertingOutboxSize))
	f.IntVar(&o.MaxInFlight, "max-in-flight", soak.DefaultMaxInFlight, "the bridge's PLEG_PUBLISH_MAX_IN_FLIGHT")
	f.DurationVar(&o.FaultLength, "fault-length", soak.DefaultFaultLength, "how long a killed part stays down, and how long stream drops go on")
	f.DurationVar(&o.Rollback, "rollback", soak.DefaultRollback, "how far back power-loss and os-crash roll a server's store: what it acknowledged in that time is lost")
	f.BoolVar(&o.NoRepair, "no-repair", false, "run the bridge without its repair of what the servers lost (PLEG_REPAIR_WINDOW=0), to see the loss it prevents")
	f.DurationVar(&o.SettleTimeout, "settle-timeout", soak.DefaultSettleTimeout, "how long to wait at the end for the stream to hold every transition")
	f.Func("bridge-env", "`NAME=VALUE` added to the bridge's environment, after the soak's own (repeatable)", func(s string) error {
		if !strings.Contains(s, "=") {
			return fmt.Errorf("want NAME=VALUE, got %q", s)
		}
		o.BridgeEnv = append(o.BridgeEnv, s)
		return nil
	})
	f.TextVar(&fl.logLevel, "log-level", fl.logLevel, "log level of the soak's own diagnostics: debug, info, warn or error")
	f.BoolVar(&o.Prometheus, "prometheus", false, fmt.Sprintf(`run a real Prometheus and Alertmanager (on PATH, or fetched as .ci/run does into $XDG_CACHE_HOME/pleg-bridge): the rules of --rules, every time divided by %d, must fire as each fault expects and resolve after it, nothing else may fire, and every query of --dashboard must return data; "all" faults are then %s`,
		soak.AlertTimeScale, strings.Join(soak.AlertingFaults, ",")))
	f.StringVar(&o.RulesFile, "rules", "deploy/prometheus/rules.yml", "the alerting rules, with --prometheus")
	f.StringVar(&o.DashboardFile, "dashboard", "deploy/grafana/pleg-bridge.json", "the Grafana dashboard whose queries must answer, with --prometheus")
	return c
}

// runSoak is the soak subcommand: churn and faults against a pleg-bridge
// binary, with a full accounting of every transition (package soak).
// It fails if any transition was lost, duplicated or reordered.
func runSoak(ctx context.Context, o soak.Options, logLevel slog.Level, env commandEnv) error {
	stdout, stderr := env.stdout, env.stderr
	temporary := o.Dir == ""
	if temporary {
		var err error
		if o.Dir, err = os.MkdirTemp("", "pleg-soak-"); err != nil {
			return fmt.Errorf("soak: %w", err)
		}
	}
	o.Logger = cli.NewLogger(stderr, cli.LogAuto, logLevel)
	o.Stdout = stdout

	// The options are checked before a bridge is built for them: a refusal
	// comes at once.
	probe := o
	probe.BridgeBinary = cmp.Or(o.BridgeBinary, "pleg-bridge")
	err := probe.Validate()
	if err == nil && o.BridgeBinary == "" {
		o.BridgeBinary, err = buildBridge(ctx, env, o.Dir)
	}
	var rep soak.Report
	if err == nil {
		rep, err = soak.Run(ctx, o)
	}
	if oe, ok := errors.AsType[*soak.OptionsError](err); ok {
		// Refused before anything ran: the directory made for it is empty.
		if temporary {
			if rerr := os.RemoveAll(o.Dir); rerr != nil {
				return fmt.Errorf("soak: %w (and remove %s: %w)", oe, o.Dir, rerr)
			}
		}
		return fmt.Errorf("soak: %w", oe)
	}
	if err != nil {
		return fmt.Errorf("soak (run directory %s): %w", o.Dir, err)
	}
	fmt.Fprintln(stdout)
	if err := rep.Table(stdout); err != nil {
		return err
	}
	if rep.Failed() {
		return fmt.Errorf("soak failed: %d missing, %d duplicated, %d out of order, %d unexpected, %d /healthz failures, %d problems, %d alert problems, %d dashboard queries without data; the bridge's log is in %s",
			rep.Total.Missing, rep.Total.Duplicated, rep.Total.OutOfOrder, len(rep.Unexpected)+len(rep.Undecodable), len(rep.Health), len(rep.Problems),
			len(rep.AlertProblems()), len(rep.EmptyPanels()), o.Dir)
	}
	if temporary {
		return os.RemoveAll(o.Dir)
	}
	return nil
}

// cacheDir is where .ci/run keeps the tools it fetches:
// ${XDG_CACHE_HOME:-$HOME/.cache}/pleg-bridge; empty if neither is set.
func cacheDir(env commandEnv) string {
	if d := env.getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "pleg-bridge")
	}
	if h := env.getenv("HOME"); h != "" {
		return filepath.Join(h, ".cache", "pleg-bridge")
	}
	return ""
}
