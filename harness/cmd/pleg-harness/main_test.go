package main

import (
	"bytes"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

// envFrom returns an environment of kv alone, for run.
func envFrom(t *testing.T, kv map[string]string) lookupFunc {
	t.Helper()
	env := maps.Clone(kv)
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

// TestSoakFlagsAreDocumented checks that the flags the docs use appear in
// soak's help as --flag with a description.
func TestSoakFlagsAreDocumented(t *testing.T) {
	t.Parallel()
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"soak", "--help"}, envFrom(t, nil), &stdout, io.Discard); err != nil {
		t.Fatalf("soak --help = %v", err)
	}
	for _, f := range []string{"--duration", "--rate", "--cluster", "--faults", "--dir", "--containers", "--lifetime", "--seed", "--duplicate-window",
		"--outbox", "--max-in-flight", "--fault-length", "--settle-timeout", "--bridge-env", "--bridge-binary", "--log-level"} {
		if !strings.Contains(stdout.String(), f+" ") {
			t.Errorf("soak --help lacks %s:\n%s", f, stdout.String())
		}
	}
}

// TestMistakesAreUsageErrors: a misspelt flag is named, with a pointer to
// the command's help, and the exit status is 2.
func TestMistakesAreUsageErrors(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{
		"soak --clustre": "pleg-harness soak: unknown flag: --clustre\nRun 'pleg-harness soak --help' for usage.\n",
		"bake":           "pleg-harness: unknown command \"bake\" for \"pleg-harness\"\nRun 'pleg-harness --help' for usage.\n",
	} {
		err := run(t.Context(), strings.Fields(args), envFrom(t, nil), io.Discard, io.Discard)
		var stderr strings.Builder
		if code := cli.Report(err, "pleg-harness", &stderr); code != 2 || stderr.String() != want {
			t.Errorf("%s: status %d, stderr %q; want 2, %q", args, code, stderr.String(), want)
		}
	}
}
