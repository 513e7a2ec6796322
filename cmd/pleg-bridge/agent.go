package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// runAgent is the run subcommand: the bridge on this node.
func runAgent(ctx context.Context, cfg Config, logger *slog.Logger) error {
	endpoint := cfg.CRIEndpoint
	if endpoint == "" {
		ep, err := generator.DiscoverEndpoint()
		if err != nil {
			return fmt.Errorf("PLEG_CRI_ENDPOINT is unset and %w; set it to the runtime's socket", err)
		}
		endpoint = ep
	}
	rt, err := generator.NewCRIClient(endpoint, generator.CRIOptions{MaxRecvMsgSize: cfg.CRIMaxRecvMsgSize, Timeout: cfg.CRITimeout})
	if err != nil {
		return err
	}
	defer rt.Close()

	natsURL := cfg.NATSURL
	if natsURL == "" {
		srv, err := startEmbeddedNATS(cfg.EmbeddedNATS, cfg.DataDir, logger)
		if err != nil {
			return err
		}
		defer func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}()
		natsURL = srv.ClientURL()
	}
	nc, err := connectNATS(natsURL, cfg, logger)
	if err != nil {
		return err
	}
	defer nc.Close()

	b, err := newBridge(cfg, rt, nc, logger)
	if err != nil {
		return err
	}
	logger.Info("pleg-bridge starting", "version", versionString(), "node", cfg.NodeName, "cri_endpoint", endpoint,
		"mode", cfg.Mode, "stream", cfg.Stream, "subject_prefix", cfg.SubjectPrefix)
	err = b.Run(ctx)
	if err := nc.Drain(); err != nil {
		logger.Debug("drain NATS connection", "err", err)
	}
	logger.Info("pleg-bridge stopped")
	return err
}

const usage = `pleg-bridge: Kubernetes container lifecycle events from the node's CRI runtime to NATS JetStream.

Usage:
  pleg-bridge run              run the bridge (configured by PLEG_* variables, below)
  pleg-bridge demo [flags]     embedded NATS + simulated runtime + bridge; prints events as a subscriber sees them
  pleg-bridge tail [flags]     follow live events, with filters (--node, --pod, --type)
  pleg-bridge replay [flags]   print stored events of a pod, a node or a time range
  pleg-bridge simulate [flags] serve the simulated CRI runtime on a unix socket (development)
  pleg-bridge version          print the version

Run "pleg-bridge <command> --help" for a command's flags.

Configuration of "run" (environment variables):
`

func printUsage(w io.Writer) error {
	fmt.Fprint(w, usage)
	return printConfigHelp(w)
}
