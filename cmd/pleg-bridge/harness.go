package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

// The soak and the fleet are the test harness's (harness/), a binary of its
// own, pleg-harness, so that the agent every node runs carries none of
// their code. pleg-bridge soak and pleg-bridge fleet stay, as DESIGN's
// commands and the docs name them: they hand their arguments over to
// pleg-harness, with this binary as the bridge the soak runs.
const (
	harnessBinary  = "pleg-harness"
	harnessPackage = "github.com/pleg-bridge/pleg-bridge/harness/cmd/pleg-harness"
	// bridgeBinaryEnv tells pleg-harness soak which pleg-bridge binary to
	// run (harness/cmd/pleg-harness/bridgebin.go).
	bridgeBinaryEnv = "PLEG_BRIDGE_BINARY"
	// harnessStopWait is how long the harness has to stop its children and
	// account for what it ran after it was asked to stop.
	harnessStopWait = time.Minute
)

func newSoakCommand(env commandEnv) *cobra.Command {
	return newHarnessCommand(env, "soak", "Run churn and faults against this bridge and account for every transition",
		`  pleg-bridge soak --duration 1m                     # one NATS server, the faults that fit
  pleg-bridge soak --cluster                         # a 3-server NATS cluster, stream replicas 3
  pleg-bridge soak --help                            # the harness's flags and faults`)
}

func newFleetCommand(env commandEnv) *cobra.Command {
	return newHarnessCommand(env, "fleet", "Run many simulated nodes' bridges against a 3-server JetStream cluster, with faults, and account for every transition",
		`  pleg-bridge fleet --nodes 50 --duration 30s --faults server-restart
  pleg-bridge fleet --help                           # the harness's flags and faults`)
}

// newHarnessCommand is a command that runs pleg-harness's command of the
// same name with its arguments, flags and --help included.
func newHarnessCommand(env commandEnv, name, short, example string) *cobra.Command {
	return &cobra.Command{
		Use:   name + " [flags]",
		Short: short,
		Long: fmt.Sprintf(`This is the test harness's command, which the agent's binary does not
carry: it runs %[1]s %[2]s with the same arguments (its --help lists
them), and the bridge it soaks is this binary. %[1]s is found on PATH or
beside this binary, or else built from the checkout the working directory
is in (go build ./harness/cmd/%[1]s).`, harnessBinary, name),
		Example:            example,
		DisableFlagParsing: true, // the harness parses them
		RunE: func(c *cobra.Command, args []string) error {
			return runHarness(c.Context(), env, name, args)
		},
	}
}

// runHarness runs pleg-harness's command name with args until it exits or
// ctx is done, when it asks it to stop (SIGTERM) and waits for it. A
// failure it reported itself is its exit status.
func runHarness(ctx context.Context, env commandEnv, name string, args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("%s: find this binary, the bridge to run: %w", name, err)
	}
	harness, cleanup, err := findHarness(ctx, env, self)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer cleanup()
	cmd := exec.CommandContext(ctx, harness, append([]string{name}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, env.stdout, env.stderr
	if env.environ != nil {
		cmd.Env = env.environ()
	}
	if env.getenv(bridgeBinaryEnv) == "" {
		cmd.Env = append(cmd.Env, bridgeBinaryEnv+"="+self)
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = harnessStopWait
	err = cmd.Run()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		if ee.ExitCode() > 0 {
			return cli.ExitStatus(ee.ExitCode())
		}
		// A write to a closed pipe (pleg-bridge soak --help | head) ends
		// the harness as it would end any command: quietly, 128+13.
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGPIPE {
			return cli.ExitStatus(128 + int(syscall.SIGPIPE))
		}
	}
	if err != nil {
		return fmt.Errorf("%s: run %s: %w", name, harness, err)
	}
	return nil
}

// findHarness returns the pleg-harness binary: on PATH, beside self, or
// built from the checkout into a temporary directory that cleanup removes.
func findHarness(ctx context.Context, env commandEnv, self string) (path string, cleanup func(), err error) {
	lookPath := cli.LookPathIn(env.getenv("PATH"))
	if p, err := lookPath(harnessBinary); err == nil {
		return p, func() {}, nil
	}
	if p := filepath.Join(filepath.Dir(self), harnessBinary); cli.IsExecutable(p) {
		return p, func() {}, nil
	}
	goCmd, err := lookPath("go")
	if err != nil {
		return "", nil, fmt.Errorf("%s is neither on PATH nor beside this binary, and there is no go command to build it: from a checkout of pleg-bridge, run go run ./harness/cmd/%s", harnessBinary, harnessBinary)
	}
	dir, err := os.MkdirTemp("", harnessBinary+"-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	out := filepath.Join(dir, harnessBinary)
	build := exec.CommandContext(ctx, goCmd, "build", "-o", out, harnessPackage)
	if env.environ != nil {
		build.Env = env.environ()
	}
	var stderr bytes.Buffer
	build.Stderr = &stderr
	if err := build.Run(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("%s is neither on PATH nor beside this binary, and building it failed (run this from a checkout of pleg-bridge): go build %s: %w: %s",
			harnessBinary, harnessPackage, err, strings.TrimSpace(stderr.String()))
	}
	return out, cleanup, nil
}
