// Command pleg-bridge publishes Kubernetes container lifecycle events from
// the node's CRI runtime to NATS JetStream as CloudEvents.
//
// The command keeps only what a command is for: the PLEG_* environment
// read into typed options (config.go), the logger, the signals, and the
// subcommands. The bridge itself, its wiring and its shutdown order, is
// package bridge, which the demo and the latency benchmark run too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "pleg-bridge:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// run is the whole program. lookup reads the environment: the bridge's
// configuration (run, demo) and the defaults of the tail and replay flags.
func run(ctx context.Context, args []string, lookup lookupFunc, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		printUsage(stderr)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		if len(rest) > 0 {
			if rest[0] == "-h" || rest[0] == "--help" || rest[0] == "help" {
				return printUsage(stdout)
			}
			return fmt.Errorf("run takes no arguments (configure it with PLEG_* variables; see pleg-bridge --help), got %q", rest)
		}
		cfg, err := loadConfig(lookup)
		if err != nil {
			return fmt.Errorf("invalid configuration:\n%w", err)
		}
		return runAgent(ctx, cfg, newLogger(stderr, cfg.LogFormat, cfg.LogLevel))
	case "demo":
		return runDemo(ctx, rest, lookup, stdout, stderr)
	case "soak":
		return runSoak(ctx, rest, stdout, stderr)
	case "simulate":
		return runSimulate(ctx, rest, stdout, stderr)
	case "tail":
		return runTail(ctx, rest, getenv(lookup), stdout, stderr)
	case "replay":
		return runReplay(ctx, rest, getenv(lookup), stdout, stderr)
	case "ps":
		return runPS(ctx, rest, getenv(lookup), stdout, stderr)
	case "version", "--version":
		printVersion(stdout)
		return nil
	case "help", "-h", "--help":
		return printUsage(stdout)
	}
	printUsage(stderr)
	return fmt.Errorf("unknown command %q", cmd)
}

// getenv reads a variable through lookup, empty when it is unset.
func getenv(lookup lookupFunc) func(string) string {
	return func(name string) string {
		v, _ := lookup(name)
		return v
	}
}
