package main

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// complete runs pleg-bridge __complete with args, as the shells' scripts
// do, and returns the completions and the directive line.
func complete(t *testing.T, lookup lookupFunc, args ...string) (completions []string, directive string, stderr string) {
	t.Helper()
	var out, errs bytes.Buffer
	if err := run(t.Context(), append([]string{"__complete"}, args...), lookup, &out, &errs); err != nil {
		t.Fatalf("__complete %q = %v", args, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	completions = append(completions, lines[:len(lines)-1]...) // nil for none
	return completions, lines[len(lines)-1], errs.String()
}

// noFileComp is the directive line of cobra.ShellCompDirectiveNoFileComp.
const noFileComp = ":4"

func TestStateFlagsCompleteFromTheStateBucket(t *testing.T) {
	t.Parallel()
	e := newPSEnv(t)
	e.seed(t)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"--pod lists the pods as namespace/name", []string{"tail", "--pod", ""}, []string{"default/job-1", "default/web-0", "kube-system/dns-0"}},
		{"--pod completes a namespace's pods", []string{"tail", "--pod", "default/w"}, []string{"default/web-0"}},
		{"--pod completes a partial namespace", []string{"replay", "--pod", "ku"}, []string{"kube-system/dns-0"}},
		{"--pod lists the pods of the --node given", []string{"tail", "--node", "node-2.example.com", "--pod", ""}, []string{"kube-system/dns-0"}},
		{"--node lists the nodes", []string{"tail", "--node", ""}, []string{"node-1", "node-2.example.com"}},
		{"--node lists the nodes of the --namespace given", []string{"replay", "-n", "kube-system", "--node", ""}, []string{"node-2.example.com"}},
		{"-n lists the namespaces", []string{"tail", "-n", ""}, []string{"default", "kube-system"}},
		{"--namespace lists the namespaces of the --pod given", []string{"ps", "--pod", "kube-system/dns-0", "--namespace", ""}, []string{"kube-system"}},
		{"ps --pod lists the pods too", []string{"ps", "--pod", "default/"}, []string{"default/job-1", "default/web-0"}},
		{"a prefix nothing has completes to nothing", []string{"tail", "--node", "nope"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, directive, _ := complete(t, lookupOf(e.getenv), tt.args...)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("completions of %q (-want +got):\n%s", tt.args, diff)
			}
			if directive != noFileComp {
				t.Errorf("directive of %q = %s, want %s (no file names)", tt.args, directive, noFileComp)
			}
		})
	}
}

func TestStateFlagsCompleteToNothingWithoutNATS(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close()
	servers := map[string]string{
		"refused": refused,
		// A listener that never accepts: the connection is made and no
		// server ever answers it.
		"silent": takenPort(t),
	}
	for name, addr := range servers {
		for _, args := range [][]string{{"tail", "--pod", ""}, {"replay", "--node", ""}, {"ps", "-n", ""}} {
			t.Run(name+" "+strings.Join(args, " "), func(t *testing.T) {
				t.Parallel()
				env := envFrom(t, map[string]string{"PLEG_NATS_URL": "nats://" + addr})
				start := time.Now()
				got, directive, stderr := complete(t, env, args...)
				if took := time.Since(start); took > stateLookupTimeout+time.Second {
					t.Errorf("completion took %s, want at most about %s", took, stateLookupTimeout)
				}
				if len(got) != 0 || directive != noFileComp {
					t.Errorf("completions %q, directive %s; want none and %s (no file names)", got, directive, noFileComp)
				}
				if !strings.Contains(stderr, "connect to NATS at nats://"+addr) {
					t.Errorf("stderr %q does not say why", stderr)
				}
			})
		}
	}
}
