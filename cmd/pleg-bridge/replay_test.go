package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// replay runs runReplay to the end and returns its output lines.
func replay(t *testing.T, env *testEnv, args ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	var stdout, stderr strings.Builder
	if err := runReplay(ctx, args, env.getenv, &stdout, &stderr); err != nil {
		t.Fatalf("replay %s: %v (stderr: %s)", strings.Join(args, " "), err, stderr.String())
	}
	if stdout.Len() == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
}

// dated prefixes tail's lines with the date, as replay prints them.
func dated(lines ...string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = "2026-01-02 " + l
	}
	return out
}

func TestReplayPrintsTheHistoryTheFlagsSelect(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{name: "--pod prints a pod's history", args: []string{"--pod", "aaaa-1111"}, want: dated(webStarted, webDied, webRemoved)},
		{name: "--node prints a node's history", args: []string{"--node", "node-2.example.com"}, want: dated(dnsSandbox, dnsStarted)},
		{name: "--node and --type combine", args: []string{"--node", "node-1", "--type", "ContainerRemoved"}, want: dated(webRemoved)},
		{name: "--since a duration prints what was stored since", args: []string{"--since", "1h"}, want: dated(webStarted, webDied, dnsSandbox, dnsStarted, webRemoved)},
		{name: "--since a time after everything prints nothing", args: []string{"--since", future}},
		{name: "--until before everything prints nothing", args: []string{"--since", "2h", "--until", "1h"}},
		{name: "a pod that never ran prints nothing", args: []string{"--pod", "no-such-pod"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, replay(t, env, tt.args...)); diff != "" {
				t.Errorf("replay %s printed (-want +got):\n%s", strings.Join(tt.args, " "), diff)
			}
		})
	}
}

func TestReplayJSONPrintsOneCloudEventPerLine(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	lines := replay(t, env, "--pod", "aaaa-1111", "--json")
	var types []string
	for _, l := range lines {
		var ce struct {
			SpecVersion string `json:"specversion"`
			Type        string `json:"type"`
			PodUID      string `json:"poduid"`
			Data        struct {
				Pod struct {
					Name string `json:"name"`
				} `json:"pod"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(l), &ce); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		if ce.SpecVersion != "1.0" || ce.PodUID != "aaaa-1111" || ce.Data.Pod.Name != "web-0" {
			t.Errorf("line %q is not web-0's CloudEvent", l)
		}
		types = append(types, ce.Type)
	}
	want := []string{"pleg.v1.ContainerStarted", "pleg.v1.ContainerDied", "pleg.v1.ContainerRemoved"}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Errorf("replay --json types (-want +got):\n%s", diff)
	}
}

func TestReplayRefusesBadFlags(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "no --pod, --node or --since is refused", args: []string{"--type", "ContainerDied"}, wantErr: "at least one of --pod, --node or --since"},
		{name: "--until alone is not enough", args: []string{"--until", "1h"}, wantErr: "at least one of --pod, --node or --since"},
		{name: "an unknown flag is named", args: []string{"--follow"}, wantErr: "follow"},
		{name: "a bad --until is named", args: []string{"--pod", "p", "--until", "soon"}, wantErr: "until"},
		{name: "--until before --since is refused", args: []string{"--since", "1h", "--until", "2h"}, wantErr: "--until"},
		{name: "an unknown --type is named", args: []string{"--pod", "p", "--type", "Died"}, wantErr: "--type"},
		{name: "a tail-only flag is named", args: []string{"--pod", "p", "--all"}, wantErr: "all"},
		{name: "an unreachable server is named by its URL", args: []string{"--pod", "p", "--nats-url", "nats://127.0.0.1:1"}, wantErr: "nats://127.0.0.1:1"},
		{name: "a missing stream is named", args: []string{"--pod", "p", "--stream", "NOPE"}, wantErr: "NOPE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr strings.Builder
			err := runReplay(t.Context(), tt.args, env.getenv, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("replay %s = %v, want an error containing %q", strings.Join(tt.args, " "), err, tt.wantErr)
			}
			if stdout.Len() > 0 {
				t.Errorf("replay printed %q on stdout, want nothing", stdout.String())
			}
		})
	}
}

func TestReplayStopsQuietlyWhenCanceled(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var stdout, stderr strings.Builder
	if err := runReplay(ctx, []string{"--since", "1h"}, env.getenv, &stdout, &stderr); err != nil {
		t.Errorf("replay with a canceled context = %v, want nil", err)
	}
}
