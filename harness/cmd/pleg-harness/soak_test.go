package main

import (
	"bytes"
	"cmp"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

func TestSoakRefusesBadFlagsNamingThem(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown fault", []string{"--faults", "nats-explode"}, `--faults: unknown fault "nats-explode"`},
		{"a cluster fault without a cluster", []string{"--faults", "leader-kill"}, "--faults: leader-kill needs a NATS cluster (--cluster)"},
		{"a duration too short for the faults", []string{"--duration", "5s"}, "--duration=5s is too short"},
		{"an argument", []string{"now"}, `unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"soak", "--dir", t.TempDir()}, tt.args...)
			err := run(t.Context(), args, envFrom(t, nil), &bytes.Buffer{}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestSoakOfAMinuteSaysWhichFaultsFit: --duration 60s with every fault is
// refused with the faults that fit a minute, and those are accepted.
func TestSoakOfAMinuteSaysWhichFaultsFit(t *testing.T) {
	err := run(t.Context(), []string{"soak", "--dir", t.TempDir(), "--duration", "60s"}, envFrom(t, nil), &bytes.Buffer{}, &bytes.Buffer{})
	const want = "in 1m0s, --faults nats-restart,bridge-kill,runtime-restart,stream-drop fits"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error = %v, want one containing %q", err, want)
	}
	o := (&soakFlags{o: soak.Options{Duration: time.Minute}, faults: "nats-restart,bridge-kill,runtime-restart,stream-drop"}).options()
	o.Dir, o.BridgeBinary = t.TempDir(), "pleg-bridge"
	if err := o.Validate(); err != nil {
		t.Errorf("the faults said to fit are refused: %v", err)
	}
}

// TestSoakRefusedLeavesNoRunDirectory: a soak refused for its flags
// removes the temporary run directory it made, and says nothing of it.
func TestSoakRefusedLeavesNoRunDirectory(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where os.MkdirTemp makes the run directory
	for _, args := range [][]string{
		{"--duration", "60s"},
		{"--faults", "nats-kill"},
		{"--faults", "leader-kill"},
	} {
		err := run(t.Context(), append([]string{"soak"}, args...), envFrom(t, nil), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Fatalf("soak %q was accepted", args)
		}
		if strings.Contains(err.Error(), "run directory") {
			t.Errorf("soak %q: the error names a run directory: %v", args, err)
		}
		left, rerr := os.ReadDir(tmp)
		if rerr != nil {
			t.Fatal(rerr)
		}
		for _, e := range left {
			t.Errorf("soak %q was refused and left %s behind", args, filepath.Join(tmp, e.Name()))
		}
	}
}

// TestSoakHelpExamplesAreValid: every example of soak --help parses and
// passes the soak's own checks.
func TestSoakHelpExamplesAreValid(t *testing.T) {
	t.Parallel()
	c := newSoakCommand(commandEnv{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	n := 0
	for line := range strings.Lines(c.Example) {
		line, _, _ = strings.Cut(line, "#")
		args, ok := strings.CutPrefix(strings.TrimSpace(line), "pleg-harness soak")
		if !ok {
			t.Errorf("example %q does not start with pleg-harness soak", line)
			continue
		}
		n++
		fl := &soakFlags{logLevel: slog.LevelWarn}
		sc := soakCommand(commandEnv{}, fl)
		if err := sc.ParseFlags(strings.Fields(args)); err != nil {
			t.Errorf("example %q: %v", line, err)
			continue
		}
		if rest := sc.Flags().Args(); len(rest) > 0 {
			t.Errorf("example %q: unexpected arguments %q", line, rest)
		}
		o := fl.options()
		o.Dir, o.BridgeBinary = cmp.Or(o.Dir, t.TempDir()), "pleg-bridge"
		if o.Prometheus {
			o.PrometheusBinary, o.AlertmanagerBinary = "prometheus", "alertmanager"
			o.RulesFile, o.DashboardFile = filepath.Join("..", "..", "..", o.RulesFile), filepath.Join("..", "..", "..", o.DashboardFile)
		}
		if err := o.Validate(); err != nil {
			t.Errorf("example %q is refused: %v", line, err)
		}
	}
	if n == 0 {
		t.Error("soak --help has no examples")
	}
}

// TestSoakWithPrometheusSaysHowToGetItsBinaries: --prometheus with neither
// binary on PATH nor in the cache names both, where it looked, and how to
// get them, before it starts anything.
func TestSoakWithPrometheusSaysHowToGetItsBinaries(t *testing.T) {
	cache := t.TempDir()
	env := envFrom(t, map[string]string{"PATH": t.TempDir(), "XDG_CACHE_HOME": cache})
	err := run(t.Context(), []string{"soak", "--prometheus", "--dir", t.TempDir()}, env, &bytes.Buffer{}, &bytes.Buffer{})
	for _, want := range []string{"--prometheus needs prometheus", "alertmanager (not on PATH", filepath.Join(cache, "pleg-bridge"), "docs/soak.md"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v, want one containing %q", err, want)
		}
	}
}
