package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// runAgent is the run subcommand: the bridge on this node, until ctx is
// done.
func runAgent(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if cfg.CRIEndpoint == "" {
		ep, err := generator.DiscoverEndpoint()
		if err != nil {
			return fmt.Errorf("PLEG_CRI_ENDPOINT is unset and %w; set it to the runtime's socket", err)
		}
		cfg.CRIEndpoint = ep
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b, err := bridge.New(cfg.bridgeOptions(logger, reg))
	if err != nil {
		return err
	}
	logger.Info("pleg-bridge starting", "version", versionString())
	err = b.Run(ctx)
	logger.Info("pleg-bridge stopped")
	return err
}

const usage = `pleg-bridge: Kubernetes container lifecycle events from the node's CRI runtime to NATS JetStream.

Usage:
  pleg-bridge run              run the bridge (configured by PLEG_* variables, below)
  pleg-bridge demo [flags]     embedded NATS + simulated runtime + bridge; prints events as a subscriber sees them
  pleg-bridge tail [flags]     follow live events, with filters (--node, --pod, --type)
  pleg-bridge replay [flags]   print stored events of a pod, a node or a time range
  pleg-bridge ps [flags]       list current containers of the cluster, a node, a namespace or a pod (--watch to follow)
  pleg-bridge simulate [flags] serve the simulated CRI runtime on a unix socket (development)
  pleg-bridge soak [flags]     churn and faults against this bridge, with a full accounting of every transition
  pleg-bridge version          print the version

Run "pleg-bridge <command> --help" for a command's flags.

Configuration of "run" (environment variables):
`

func printUsage(w io.Writer) error {
	fmt.Fprint(w, usage)
	return printConfigHelp(w)
}
