// Command pleg-harness runs the harnesses that prove pleg-bridge under
// churn and faults: soak (one node's bridge, the real binary, against one
// NATS server or a cluster of three, with every transition accounted for)
// and fleet (many simulated nodes' bridges against a 3-server cluster).
//
// It is a binary of its own so that the agent's binary, which every node
// runs, carries none of it. pleg-harness soak and pleg-harness fleet, which
// the docs and DESIGN name, hand over to it (cmd/pleg-bridge/harness.go).
//
//	go run ./harness/cmd/pleg-harness soak --duration 1m
//	go run ./harness/cmd/pleg-harness fleet --nodes 50 --duration 30s
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.Report(err, "pleg-harness", os.Stderr))
}

// lookupFunc reads a variable of the environment.
type lookupFunc func(name string) (string, bool)

// commandEnv is what run gives every subcommand: the environment and the
// output streams. Subcommands read and write nothing else, so tests call
// run in-process and in parallel.
type commandEnv struct {
	lookup         lookupFunc
	stdout, stderr io.Writer
}

// getenv reads a variable, empty when it is unset.
func (e commandEnv) getenv(name string) string {
	if e.lookup == nil {
		return ""
	}
	v, _ := e.lookup(name)
	return v
}

// run is the whole program as main runs it.
func run(ctx context.Context, args []string, lookup lookupFunc, stdout, stderr io.Writer) error {
	env := commandEnv{lookup: lookup, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "pleg-harness",
		Short: "Churn and faults against pleg-bridge, with a full accounting of every transition",
		RunE: func(c *cobra.Command, _ []string) error {
			c.Help()
			return cli.ErrUsage
		},
	}
	cli.Configure(root, stdout, stderr)
	root.AddCommand(newSoakCommand(env), newFleetCommand(env))
	for _, c := range root.Commands() {
		c.Long = strings.TrimSpace(c.Short + ".\n\n" + c.Long)
	}
	return cli.Execute(ctx, root, args)
}
