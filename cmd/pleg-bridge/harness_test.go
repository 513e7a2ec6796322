package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tests that write a script and run it are not parallel: a fork of a
// parallel test while the script is open for writing makes its exec fail
// with ETXTBSY.

// TestSoakAndFleetHandOverToTheHarness runs pleg-bridge soak and fleet
// with a pleg-harness on PATH that prints what it was given: its
// arguments, flags and --help included, the bridge binary it is to soak,
// and its exit status are pleg-bridge's.
func TestSoakAndFleetHandOverToTheHarness(t *testing.T) {
	bin := t.TempDir()
	script := "#!/bin/sh\necho \"args: $*\"\necho \"bridge: $PLEG_BRIDGE_BINARY\"\nexit 3\n"
	if err := os.WriteFile(filepath.Join(bin, "pleg-harness"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"soak", "--duration", "1m", "--faults", "bridge-kill"},
		{"soak", "--help"},
		{"fleet", "--nodes", "5"},
	} {
		var stdout strings.Builder
		err := run(t.Context(), args, envFrom(t, map[string]string{"PATH": bin}), &stdout, &strings.Builder{})
		want := "args: " + strings.Join(args, " ") + "\nbridge: " + self + "\n"
		if stdout.String() != want {
			t.Errorf("%q: the harness printed %q, want %q", args, stdout.String(), want)
		}
		if code := report(err, &strings.Builder{}); code != 3 {
			t.Errorf("%q: exit status %d (err %v), want the harness's 3", args, code, err)
		}
	}
}

// TestSoakWithoutTheHarnessSaysHowToRunIt: with neither pleg-harness nor
// go on PATH, the error says what to run.
func TestSoakWithoutTheHarnessSaysHowToRunIt(t *testing.T) {
	err := run(t.Context(), []string{"soak"}, envFrom(t, map[string]string{"PATH": t.TempDir()}), &strings.Builder{}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "go run ./harness/cmd/pleg-harness") {
		t.Errorf("err = %v, want one saying to go run ./harness/cmd/pleg-harness", err)
	}
}

// TestHarnessEndedByAClosedPipeIsQuiet: a harness ended by SIGPIPE (its
// help piped into head) is no error of pleg-bridge's to print.
func TestHarnessEndedByAClosedPipeIsQuiet(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "pleg-harness"), []byte("#!/bin/sh\nkill -PIPE $$\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := run(t.Context(), []string{"soak", "--help"}, envFrom(t, map[string]string{"PATH": bin}), &strings.Builder{}, &strings.Builder{})
	var stderr strings.Builder
	if code := report(err, &stderr); code != 141 || stderr.Len() > 0 {
		t.Errorf("exit status %d, stderr %q (err %v); want 141 and nothing printed", code, stderr.String(), err)
	}
}
