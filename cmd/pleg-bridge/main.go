// Command pleg-bridge publishes Kubernetes container lifecycle events from
// the node's CRI runtime to NATS JetStream as CloudEvents.
//
// The command keeps only what a command is for: the PLEG_* environment
// read into typed options (config.go), the logger, the signals, and the
// subcommands (commands.go). The bridge itself, its wiring and its shutdown
// order, is package bridge, which the demo and the latency benchmark run
// too.
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
	// A write to a closed stdout (pleg-bridge tail | head) must fail with
	// EPIPE rather than kill the process with SIGPIPE: tail and replay then
	// return and delete their consumer on the server. Asking for SIGPIPE is
	// what turns the kill into an error; the channel is never read. Unlike
	// ignoring the signal, this is not inherited by the bridge soak starts.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	root := newRootCommand(commandEnv{lookup: os.LookupEnv, environ: os.Environ, stdout: os.Stdout, stderr: os.Stderr})
	err := execute(ctx, root, os.Args[1:])
	stop()
	os.Exit(report(err, os.Stderr))
}

// errUsage is returned when pleg-bridge runs without a command; run has
// printed the usage on stderr.
var errUsage = errors.New("usage")

// usageError is a mistake in the command line: an unknown command or flag,
// a flag value that does not parse or does not make sense, a stray
// argument. report prints it once, with a pointer to the command's --help,
// and the exit status is 2.
type usageError struct {
	cmd string // the command path, "pleg-bridge tail"
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usageErrorf returns a *usageError of cmd with a formatted message.
func usageErrorf(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, err: fmt.Errorf(format, args...)}
}

// report prints what the user needs to know about err on stderr, once, and
// returns the exit status: 0 for success or help, 2 for a usage error, 1
// for anything else.
func report(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", ue.cmd, ue.err, ue.cmd)
		return 2
	}
	fmt.Fprintln(stderr, "pleg-bridge:", err)
	return 1
}

// run is the whole program as main runs it, but for the warning about
// unknown PLEG_ variables, which needs the whole environment. lookup reads
// the environment: the bridge's
// configuration (run, demo) and the defaults of the tail and replay flags.
// Nothing else reads the process environment or writes to the process's
// standard streams, so tests call run in-process and in parallel.
func run(ctx context.Context, args []string, lookup lookupFunc, stdout, stderr io.Writer) error {
	root := newRootCommand(commandEnv{lookup: lookup, stdout: stdout, stderr: stderr})
	return execute(ctx, root, args)
}

// getenv reads a variable through lookup, empty when it is unset.
func getenv(lookup lookupFunc) func(string) string {
	return func(name string) string {
		v, _ := lookup(name)
		return v
	}
}
