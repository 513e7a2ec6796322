package main

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEverySubcommandHasHelpWithExamples asks each subcommand for --help:
// a one-line description, examples that run the command, the flags spelled
// --flag, all on stdout, and nothing on stderr. A passthrough subcommand's
// help is its own, and is not checked here.
func TestEverySubcommandHasHelpWithExamples(t *testing.T) {
	t.Parallel()
	root := newRootCommand(commandEnv{lookup: envFrom(t, nil), stdout: io.Discard, stderr: io.Discard})
	var names []string
	for _, c := range root.Commands() {
		names = append(names, c.Name())
		if c.Hidden || c.Name() == "help" || c.DisableFlagParsing {
			continue
		}
		if c.Short == "" || strings.Contains(c.Short, "\n") {
			t.Errorf("%s: description %q is not one line", c.Name(), c.Short)
		}
		t.Run(c.Name(), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if err := run(t.Context(), []string{c.Name(), "--help"}, envFrom(t, nil), &stdout, &stderr); err != nil {
				t.Fatalf("%s --help = %v", c.Name(), err)
			}
			help := stdout.String()
			if !strings.HasPrefix(help, c.Short+".\n") {
				t.Errorf("%s --help does not start with its description %q:\n%s", c.Name(), c.Short, help)
			}
			for _, want := range []string{"Usage:", "Examples:\n", "Flags:", "  -h, --help"} {
				if !strings.Contains(help, want) {
					t.Errorf("%s --help lacks %q:\n%s", c.Name(), want, help)
				}
			}
			_, examples, _ := strings.Cut(help, "Examples:\n")
			examples, _, _ = strings.Cut(examples, "\n\n")
			if !strings.Contains(examples, "pleg-bridge "+c.Name()) {
				t.Errorf("%s --help has no example running it:\n%s", c.Name(), help)
			}
			if stderr.Len() > 0 {
				t.Errorf("%s --help wrote on stderr: %s", c.Name(), stderr.String())
			}
		})
	}
	for _, want := range []string{"completion", "demo", "fleet", "replay", "run", "simulate", "soak", "tail", "version"} {
		if !slices.Contains(names, want) {
			t.Errorf("no subcommand %s among %q", want, names)
		}
	}
}

// TestSubcommandFlagsAreDocumented checks that the flags the README and the
// deployment files use appear in the help as --flag with a description.
func TestSubcommandFlagsAreDocumented(t *testing.T) {
	t.Parallel()
	flags := map[string][]string{
		"tail":     {"--nats-url", "--stream", "--prefix", "--node", "--pod", "-n, --namespace", "-c, --container", "--type", "--json", "--color", "--all", "--since", "--from-seq"},
		"replay":   {"--nats-url", "--stream", "--prefix", "--node", "--pod", "-n, --namespace", "-c, --container", "--type", "--json", "--color", "--since", "--until"},
		"demo":     {"--duration", "--rate", "--lifetime", "--containers", "--nats-listen", "--listen", "--log-level"},
		"simulate": {"--socket", "--rate", "--lifetime", "--containers", "--behave-like"},
		"creds":    {"--signing-key", "--account", "--account-jwt", "--node", "--out", "--expiry"},
	}
	for cmd, want := range flags {
		var stdout bytes.Buffer
		if err := run(t.Context(), []string{cmd, "--help"}, envFrom(t, nil), &stdout, io.Discard); err != nil {
			t.Fatalf("%s --help = %v", cmd, err)
		}
		for _, f := range want {
			if !strings.Contains(stdout.String(), f+" ") {
				t.Errorf("%s --help lacks %s:\n%s", cmd, f, stdout.String())
			}
		}
	}
}

func TestRootHelpAndRunHelpListTheVariables(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"run", "--help"}} {
		var stdout, stderr bytes.Buffer
		if err := run(t.Context(), args, envFrom(t, nil), &stdout, &stderr); err != nil {
			t.Fatalf("%s = %v", strings.Join(args, " "), err)
		}
		for _, want := range []string{"PLEG_NODE_NAME", "PLEG_NATS_URL", "PLEG_LOG_FORMAT"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("%s lacks %s:\n%s", strings.Join(args, " "), want, stdout.String())
			}
		}
		if stderr.Len() > 0 {
			t.Errorf("%s wrote on stderr: %s", strings.Join(args, " "), stderr.String())
		}
	}
}

func TestNoCommandPrintsTheUsageOnStderrAndExitsTwo(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), nil, envFrom(t, nil), &stdout, &stderr)
	if code := report(err, &stderr); code != 2 {
		t.Errorf("exit status %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), "pleg-bridge tail [flags]") || !strings.Contains(stderr.String(), "PLEG_NATS_URL") {
		t.Errorf("stderr lacks the usage:\n%s", stderr.String())
	}
	if stdout.Len() > 0 {
		t.Errorf("stdout: %s", stdout.String())
	}
}

// TestUsageErrorsArePrintedOnceAndExitTwo runs each mistake as main would:
// run, then report. The message appears once on stderr, with a pointer to
// the command's --help, nothing on stdout, and the exit status is 2.
func TestUsageErrorsArePrintedOnceAndExitTwo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string // the whole of stderr
	}{
		{[]string{"tail", "--bogus"}, "pleg-bridge tail: unknown flag: --bogus\nRun 'pleg-bridge tail --help' for usage.\n"},
		{[]string{"tail", "-x"}, "pleg-bridge tail: unknown shorthand flag: 'x' in -x\nRun 'pleg-bridge tail --help' for usage.\n"},
		{[]string{"tail", "extra"}, "pleg-bridge tail: unexpected argument \"extra\"\nRun 'pleg-bridge tail --help' for usage.\n"},
		{[]string{"tail", "--type", "changed"}, "pleg-bridge tail: --type \"changed\": want started, died or removed (or ContainerStarted, ContainerDied, ContainerRemoved)\nRun 'pleg-bridge tail --help' for usage.\n"},
		{[]string{"replay", "--since", "soon"}, "pleg-bridge replay: invalid argument \"soon\" for \"--since\" flag: want a duration before now (10m, 2h) or an RFC 3339 time (2026-01-02T03:04:05Z)\nRun 'pleg-bridge replay --help' for usage.\n"},
		{[]string{"replay", "--type", "died"}, "pleg-bridge replay: replay needs at least one of --pod, --node, --namespace, --container or --since, so as not to print the whole stream\nRun 'pleg-bridge replay --help' for usage.\n"},
		{[]string{"demo", "--rate", "fast"}, "pleg-bridge demo: invalid argument \"fast\" for \"--rate\" flag: strconv.ParseFloat: parsing \"fast\": invalid syntax\nRun 'pleg-bridge demo --help' for usage.\n"},
		{[]string{"demo", "--rate", "0"}, "pleg-bridge demo: --rate=0 must be positive\nRun 'pleg-bridge demo --help' for usage.\n"},
		{[]string{"simulate", "--behave-like", "cri-o"}, "pleg-bridge simulate: --behave-like=\"cri-o\": want containerd-2.4 or containerd-1.7\nRun 'pleg-bridge simulate --help' for usage.\n"},
		{[]string{"run", "now"}, "pleg-bridge run: run takes no arguments (configure it with PLEG_* variables), got [\"now\"]\nRun 'pleg-bridge run --help' for usage.\n"},
		{[]string{"completion", "tcsh"}, "pleg-bridge completion: unknown shell \"tcsh\": want one of bash, zsh, fish\nRun 'pleg-bridge completion --help' for usage.\n"},
		{[]string{"serve"}, "pleg-bridge: unknown command \"serve\" for \"pleg-bridge\"\nRun 'pleg-bridge --help' for usage.\n"},
		{[]string{"--bogus"}, "pleg-bridge: unknown flag: --bogus\nRun 'pleg-bridge --help' for usage.\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, envFrom(t, nil), &stdout, &stderr)
			if code := report(err, &stderr); code != 2 {
				t.Errorf("exit status %d (error %v), want 2", code, err)
			}
			if diff := cmp.Diff(tt.want, stderr.String()); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout: %s", stdout.String())
			}
		})
	}
}

func TestOtherErrorsExitOne(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	err := run(t.Context(), []string{"tail", "--nats-url", "nats://127.0.0.1:1"}, envFrom(t, nil), io.Discard, &stderr)
	if code := report(err, &stderr); code != 1 {
		t.Errorf("exit status %d (error %v), want 1", code, err)
	}
	if got := strings.Count(stderr.String(), "nats://127.0.0.1:1"); got != 1 {
		t.Errorf("stderr names the server %d times, want once:\n%s", got, stderr.String())
	}
}

func TestVersionPrintsOneLine(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var stdout bytes.Buffer
		if err := run(t.Context(), args, envFrom(t, nil), &stdout, io.Discard); err != nil {
			t.Fatalf("%s = %v", args[0], err)
		}
		if diff := cmp.Diff(versionLine()+"\n", stdout.String()); diff != "" {
			t.Errorf("%s printed (-want +got):\n%s", args[0], diff)
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	t.Parallel()
	for shell, want := range map[string]string{
		"bash": "# bash completion V2 for pleg-bridge",
		"zsh":  "#compdef pleg-bridge",
		"fish": "# fish completion for pleg-bridge",
	} {
		var stdout bytes.Buffer
		if err := run(t.Context(), []string{"completion", shell}, envFrom(t, nil), &stdout, io.Discard); err != nil {
			t.Fatalf("completion %s = %v", shell, err)
		}
		if !strings.HasPrefix(stdout.String(), want) {
			t.Errorf("completion %s starts %.80q, want %q", shell, stdout.String(), want)
		}
	}

	// What the scripts ask the binary for: the values of --type and
	// --color, and the subcommands.
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"tail", "--type", ""}, []string{"started", "died", "removed"}},
		{[]string{"replay", "--color", ""}, []string{"auto", "always", "never"}},
		{[]string{"ta"}, []string{"tail\tFollow container lifecycle events as they arrive, one line each, until Ctrl-C"}},
	}
	for _, tt := range tests {
		var stdout bytes.Buffer
		if err := run(t.Context(), append([]string{"__complete"}, tt.args...), envFrom(t, nil), &stdout, io.Discard); err != nil {
			t.Fatalf("__complete %q = %v", tt.args, err)
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		if diff := cmp.Diff(tt.want, lines[:len(lines)-1]); diff != "" { // the last line is cobra's directive
			t.Errorf("completions of %q (-want +got):\n%s", tt.args, diff)
		}
	}
}
