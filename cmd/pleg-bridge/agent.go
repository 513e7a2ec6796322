package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/internal/gctune"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// runAgent is the run subcommand: the bridge on this node, until ctx is
// done.
func runAgent(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if cfg.CRIEndpoint == "" {
		ep, err := cri.DiscoverEndpoint()
		if err != nil {
			return fmt.Errorf("PLEG_CRI_ENDPOINT is unset and %w; set it to the runtime's socket", err)
		}
		cfg.CRIEndpoint = ep
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(runtimeCollectors()...)
	opts := cfg.bridgeOptions(logger, reg)
	// The process's garbage collector is this command's to tune, low
	// through the bridge's start-up (its memory peak), unless GOGC is set.
	gc := gctune.Start(opts.Mode)
	defer gc.Stop()
	opts.StartupOver = gc.StartupOver
	b, err := bridge.New(opts)
	if err != nil {
		return err
	}
	logger.Info("pleg-bridge starting", "version", versionString())
	err = b.Run(ctx)
	logger.Info("pleg-bridge stopped")
	return withSetting(err, cfg)
}

// buildInfo is the pleg_bridge_build_info gauge, always 1, whose labels
// say which build runs: a dashboard or an alert joins on it to tell the
// versions of a rollout apart, and the contract and data directory format
// versions say which of them a rollback crosses (CHANGELOG.md).
func buildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pleg_bridge_build_info",
		Help: "Always 1; the labels are the version and commit of pleg-bridge, the Go version it was built with, and the wire contract and data directory format versions it writes.",
		ConstLabels: prometheus.Labels{
			"version":          versionString(),
			"go_version":       runtime.Version(),
			"commit":           commitString(),
			"contract_version": schemas.ContractVersion,
			"format_version":   datadir.FormatVersion,
		},
	})
	g.Set(1)
	return g
}

// withSetting adds to an error of the bridge the variable to change, where
// the bridge's message names only its option or a path.
func withSetting(err error, cfg Config) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && errors.Is(err, fs.ErrPermission) && cfg.DataDir != "" && within(pe.Path, cfg.DataDir) {
		return fmt.Errorf("%w; set PLEG_DATA_DIR to a directory this user can write (e.g. $HOME/.local/share/pleg-bridge)", err)
	}
	var le *bridge.ListenError
	if !errors.As(err, &le) {
		return err
	}
	switch le.Option {
	case bridge.OptionEmbeddedListen:
		return fmt.Errorf("%w; set PLEG_EMBEDDED_NATS_LISTEN to a free address (host:port, port -1 for any), or PLEG_NATS_URL to a NATS server that runs already", err)
	case bridge.OptionListenAddress:
		return fmt.Errorf("%w; set PLEG_LISTEN_ADDRESS to a free address (empty: no metrics and health endpoint)", err)
	}
	return err
}

// within reports whether path is dir or under it, or one of dir's parents
// (MkdirAll fails on the first parent it cannot create).
func within(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	rel, err := filepath.Rel(path, dir)
	if err == nil && !strings.HasPrefix(rel, "..") {
		return true
	}
	rel, err = filepath.Rel(dir, path)
	return err == nil && !strings.HasPrefix(rel, "..")
}

// runtimeCollectors are the Go runtime's and the process's metrics, and the
// build info, which /metrics serves beside the bridge's own.
func runtimeCollectors() []prometheus.Collector {
	return []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo()}
}
