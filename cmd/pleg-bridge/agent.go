package main

import (
	"context"
	"fmt"
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
	reg.MustRegister(runtimeCollectors()...)
	b, err := bridge.New(cfg.bridgeOptions(logger, reg))
	if err != nil {
		return err
	}
	logger.Info("pleg-bridge starting", "version", versionString())
	err = b.Run(ctx)
	logger.Info("pleg-bridge stopped")
	return err
}

// runtimeCollectors are the Go runtime's and the process's metrics, which
// /metrics serves beside the bridge's own.
func runtimeCollectors() []prometheus.Collector {
	return []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}
}
