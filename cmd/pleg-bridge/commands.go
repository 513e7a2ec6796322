package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

// commandEnv is what run gives every subcommand: the environment and the
// output streams. Subcommands read and write nothing else.
type commandEnv struct {
	lookup lookupFunc
	// environ lists the environment, NAME=value, for run's warning about
	// PLEG_ variables it does not know; nil: no warning.
	environ        func() []string
	stdout, stderr io.Writer
}

// getenv reads a variable, empty when it is unset.
func (e commandEnv) getenv(name string) string { return getenv(e.lookup)(name) }

const rootUsage = `pleg-bridge: Kubernetes container lifecycle events from the node's CRI runtime to NATS JetStream.

Usage:
  pleg-bridge run              run the bridge (configured by PLEG_* variables, below)
  pleg-bridge demo [flags]     embedded NATS + simulated runtime + bridge; prints events as a subscriber sees them
  pleg-bridge tail [flags]     follow events as they arrive, with filters (--node, --pod, --namespace, --container, --type)
  pleg-bridge replay [flags]   print the stored events of a pod, a node, a namespace or a time range, and exit
  pleg-bridge ps [flags]       list the current containers of the cluster, a node, a namespace or a pod (--watch to follow)
  pleg-bridge simulate [flags] serve the simulated CRI runtime on a unix socket (development)
  pleg-bridge soak [flags]     churn and faults against this bridge, with a full accounting of every transition
  pleg-bridge fleet [flags]    many simulated nodes' bridges against a 3-server JetStream cluster, with faults and capacity figures
  pleg-bridge creds [flags]    mint a node's NATS credentials, limited to its own subjects (deploy/nats/README.md)
  pleg-bridge version          print the version
  pleg-bridge completion bash|zsh|fish   print a shell completion script

Run "pleg-bridge <command> --help" for a command's description, flags and examples.

Configuration of "run" (environment variables):
`

// printUsage prints the commands and the PLEG_* variables with their
// defaults: pleg-bridge --help, which the README quotes.
func printUsage(w io.Writer) error {
	fmt.Fprint(w, rootUsage)
	return printConfigHelp(w)
}

// newRootCommand returns the command tree of pleg-bridge. Each call builds
// a new tree: cobra commands hold their parsed flags, and tests run many in
// parallel.
//
// Adding a subcommand: write newXxxCommand(env) returning a *cobra.Command
// with Use, a one-line Short, Example and Args: cli.NoArgs, its flags declared
// on c.Flags() (spelled --flag; defaults from env.getenv where the agent
// has a PLEG_ variable for the same thing), and RunE calling the work with
// c.Context(); return cli.UsageErrorf for a flag value that makes no sense, so
// it exits 2 with a pointer to --help. Then add it below, and a line for it
// in rootUsage.
func newRootCommand(env commandEnv) *cobra.Command {
	root := &cobra.Command{
		Use:     "pleg-bridge",
		Short:   "Kubernetes container lifecycle events from the node's CRI runtime to NATS JetStream",
		Version: versionString(),
		RunE: func(c *cobra.Command, _ []string) error {
			printUsage(env.stderr)
			return cli.ErrUsage
		},
	}
	// Errors are returned for report to print once; our own completion
	// command, with examples and without powershell, replaces cobra's.
	cli.Configure(root, env.stdout, env.stderr)
	root.SetVersionTemplate(versionLine() + "\n")
	cobraHelp := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		switch {
		case c == root:
			printUsage(c.OutOrStdout())
		case c.Name() == "run":
			cobraHelp(c, args)
			fmt.Fprintln(c.OutOrStdout(), "\nConfiguration (environment variables):")
			printConfigHelp(c.OutOrStdout())
		default:
			cobraHelp(c, args)
		}
	})
	root.AddCommand(
		newRunCommand(env),
		newDemoCommand(env),
		newTailCommand(env),
		newReplayCommand(env),
		newPSCommand(env),
		newSimulateCommand(env),
		newSoakCommand(env),
		newFleetCommand(env),
		newCredsCommand(env),
		newVersionCommand(env),
		newCompletionCommand(env),
	)
	// Every help starts with the one-line description; Long, where there
	// is one, goes on from there.
	for _, c := range root.Commands() {
		c.Long = strings.TrimSpace(c.Short + ".\n\n" + c.Long)
	}
	return root
}

func newRunCommand(env commandEnv) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Run the bridge on this node, configured by PLEG_* environment variables",
		Long: `It watches the CRI runtime and publishes every container lifecycle event to
NATS JetStream until SIGINT or SIGTERM. It takes no flags: the PLEG_*
environment variables below configure it, as the DaemonSet does.`,
		Example: `  PLEG_NATS_URL=nats://nats:4222 pleg-bridge run
  PLEG_CRI_ENDPOINT=unix:///run/crio/crio.sock PLEG_MODE=generic pleg-bridge run
  pleg-bridge run        # no PLEG_NATS_URL: an embedded NATS server with JetStream`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return cli.UsageErrorf(c.CommandPath(), "run takes no arguments (configure it with PLEG_* variables), got %q", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := loadConfig(env.lookup)
			if err != nil {
				return fmt.Errorf("invalid configuration:\n%w", err)
			}
			logger := cli.NewLogger(env.stderr, cfg.LogFormat, cfg.LogLevel)
			if env.environ != nil {
				warnUnknownVariables(logger, env.environ())
			}
			return runAgent(c.Context(), cfg, logger)
		},
	}
}

func newVersionCommand(env commandEnv) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version, the Go version and the platform",
		Example: "  pleg-bridge version\n  pleg-bridge --version",
		Args:    cli.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(env.stdout, versionLine())
			return err
		},
	}
}

// completionShells are the shells completion writes a script for.
var completionShells = []string{"bash", "zsh", "fish"}

func newCompletionCommand(env commandEnv) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print the shell completion script for bash, zsh or fish",
		Long: `The script goes to stdout. It completes commands, flags and the values of
--type and --color, and those of --node, --namespace and --pod from the
bridges' state bucket, as kubectl completes names from the API (nothing when
NATS does not answer within 2 s). The bash script needs the bash-completion
package.`,
		Example: `  source <(pleg-bridge completion bash)                           # this shell
  pleg-bridge completion bash > /etc/bash_completion.d/pleg-bridge  # every shell
  pleg-bridge completion zsh > "${fpath[1]}/_pleg-bridge"
  pleg-bridge completion fish > ~/.config/fish/completions/pleg-bridge.fish`,
		ValidArgs: completionShells,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return cli.UsageErrorf(c.CommandPath(), "want one shell: %s", strings.Join(completionShells, ", "))
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(env.stdout, true)
			case "zsh":
				return root.GenZshCompletion(env.stdout)
			case "fish":
				return root.GenFishCompletion(env.stdout, true)
			}
			return cli.UsageErrorf(c.CommandPath(), "unknown shell %q: want one of %s", args[0], strings.Join(completionShells, ", "))
		},
	}
}
