package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
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
	err := cli.Execute(ctx, root, os.Args[1:])
	stop()
	os.Exit(report(err, os.Stderr))
}

// report prints what the user needs to know about err on stderr, once, and
// returns the exit status: 0 for success or help, 2 for a usage error, 1
// for anything else.
func report(err error, stderr io.Writer) int { return cli.Report(err, "pleg-bridge", stderr) }

// run is the whole program as main runs it, but for the warning about
// unknown PLEG_ variables, which needs the whole environment. lookup reads
// the environment: the bridge's
// configuration (run, demo) and the defaults of the tail and replay flags.
// Nothing else reads the process environment or writes to the process's
// standard streams, so tests call run in-process and in parallel.
func run(ctx context.Context, args []string, lookup lookupFunc, stdout, stderr io.Writer) error {
	root := newRootCommand(commandEnv{lookup: lookup, stdout: stdout, stderr: stderr})
	return cli.Execute(ctx, root, args)
}

// getenv reads a variable through lookup, empty when it is unset.
func getenv(lookup lookupFunc) func(string) string {
	return func(name string) string {
		v, _ := lookup(name)
		return v
	}
}
