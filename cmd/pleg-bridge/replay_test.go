package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// replay runs pleg-bridge replay to the end and returns its output lines.
func replay(t *testing.T, env *testEnv, args ...string) []string {
	t.Helper()
	stdout, _ := replayOutput(t, env, args...)
	return stdout
}

// replayOutput runs pleg-bridge replay to the end and returns its stdout
// and stderr lines.
func replayOutput(t *testing.T, env *testEnv, args ...string) (stdout, stderr []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	var out, errs strings.Builder
	if err := run(ctx, append([]string{"replay"}, args...), env.lookup, &out, &errs); err != nil {
		t.Fatalf("replay %s: %v (stderr: %s)", strings.Join(args, " "), err, errs.String())
	}
	return splitLines(out.String()), splitLines(errs.String())
}

// splitLines returns the lines of s, nil for "".
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
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
		{name: "--pod namespace/name prints a pod's history", args: []string{"--pod", "default/web-0"}, want: dated(webStarted, webDied, webRemoved)},
		{name: "--namespace prints a namespace's history", args: []string{"--namespace", "kube-system"}, want: dated(dnsSandbox, dnsStarted)},
		{name: "--container prints the history of containers of that name", args: []string{"--container", "app"}, want: dated(webStarted, webDied, webRemoved)},
		{name: "--type takes a short form in any case", args: []string{"-n", "default", "--type", "Died"}, want: dated(webDied)},
		{name: "--type takes the CloudEvent type", args: []string{"--since", "1h", "--type", "pleg.v1.ContainerRemoved"}, want: dated(webRemoved)},
		{name: "--node prints a node's history", args: []string{"--node", "node-2.example.com"}, want: dated(dnsSandbox, dnsStarted)},
		{name: "--node and --type combine", args: []string{"--node", "node-1", "--type", "ContainerRemoved"}, want: dated(webRemoved)},
		{name: "--since a duration prints what was stored since", args: []string{"--since", "1h"}, want: dated(webStarted, webDied, dnsSandbox, dnsStarted, webRemoved)},
		{name: "--since a time after everything prints nothing", args: []string{"--since", future}},
		{name: "--until before everything prints nothing", args: []string{"--since", "2h", "--until", "1h"}},
		{name: "a pod that never ran prints nothing", args: []string{"--pod", "no-such-pod"}},
		{name: "a pod by name in another namespace prints nothing", args: []string{"--pod", "kube-system/web-0"}},
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

// TestReplaySaysWhenNothingMatched checks that a replay that prints
// nothing says so on stderr, naming what it looked for, and that one that
// prints something says nothing.
func TestReplaySaysWhenNothingMatched(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	where := " in stream EVENTS on " + env.url
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{
			name: "a pod by name",
			args: []string{"--pod", "default/web-1", "--type", "removed"},
			want: []string{"pleg-bridge replay: no events matched pod default/web-1, type ContainerRemoved" + where},
		},
		{
			name: "a pod name taken as a UID, with a hint",
			args: []string{"--pod", "web-0"},
			want: []string{"pleg-bridge replay: no events matched pod UID web-0" + where + "; --pod web-0 is taken as a pod UID, a pod by name is --pod <namespace>/web-0"},
		},
		{
			name: "a UID-shaped pod, without a hint",
			args: []string{"--pod", "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70"},
			want: []string{"pleg-bridge replay: no events matched pod UID 6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70" + where},
		},
		{
			name: "a node, a namespace and a container in a time range",
			args: []string{"--node", "node-1", "-n", "kube-system", "-c", "dns", "--since", "2026-01-02T00:00:00Z", "--until", "2026-01-03T00:00:00Z"},
			want: []string{"pleg-bridge replay: no events matched node node-1, namespace kube-system, container dns, since 2026-01-02T00:00:00Z, until 2026-01-03T00:00:00Z" + where},
		},
		{name: "something matched", args: []string{"--pod", "default/web-0", "--type", "removed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, stderr := replayOutput(t, env, tt.args...)
			if diff := cmp.Diff(tt.want, stderr); diff != "" {
				t.Errorf("replay %s said on stderr (-want +got):\n%s", strings.Join(tt.args, " "), diff)
			}
		})
	}
}

// TestReplayHighlightsDeathsOnlyInColor checks --color: the ContainerDied
// with exit 137 (OOMKilled) is red with --color always, and no line has an
// escape otherwise. stdout is never a terminal here, so auto means none.
func TestReplayHighlightsDeathsOnlyInColor(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	env.seed(t)
	red := []string{dated(webStarted)[0], "\x1b[1;31m" + dated(webDied)[0] + "\x1b[0m", dated(webRemoved)[0]}
	plain := dated(webStarted, webDied, webRemoved)
	tests := []struct {
		args []string
		want []string
	}{
		{args: []string{"--color", "always"}, want: red},
		{args: []string{"--color", "never"}, want: plain},
		{args: []string{"--color", "auto"}, want: plain},
		{args: nil, want: plain},
	}
	for _, tt := range tests {
		args := append([]string{"--pod", "default/web-0"}, tt.args...)
		if diff := cmp.Diff(tt.want, replay(t, env, args...)); diff != "" {
			t.Errorf("replay %s printed (-want +got):\n%s", strings.Join(args, " "), diff)
		}
	}
}

func TestReplayRefusesBadFlags(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	tests := []struct {
		name      string
		args      []string
		wantErr   string
		wantUsage bool // a *cli.UsageError: exit status 2
	}{
		{name: "no --pod, --node or --since is refused", args: []string{"--type", "ContainerDied"}, wantErr: "at least one of --pod, --node, --namespace, --container or --since", wantUsage: true},
		{name: "--until alone is not enough", args: []string{"--until", "1h"}, wantErr: "at least one of", wantUsage: true},
		{name: "an unknown flag is named", args: []string{"--follow"}, wantErr: "follow", wantUsage: true},
		{name: "a bad --until is named", args: []string{"--pod", "p", "--until", "soon"}, wantErr: "until", wantUsage: true},
		{name: "--until before --since is refused", args: []string{"--since", "1h", "--until", "2h"}, wantErr: "--until", wantUsage: true},
		{name: "an unknown --type is named", args: []string{"--pod", "p", "--type", "Changed"}, wantErr: "--type", wantUsage: true},
		{name: "a --pod with too many slashes is named", args: []string{"--pod", "a/b/c"}, wantErr: "--pod", wantUsage: true},
		{name: "a tail-only flag is named", args: []string{"--pod", "p", "--all"}, wantErr: "all", wantUsage: true},
		{name: "an unreachable server is named by its URL", args: []string{"--pod", "p", "--nats-url", "nats://127.0.0.1:1"}, wantErr: "nats://127.0.0.1:1"},
		{name: "a refused connection says so", args: []string{"--pod", "p", "--nats-url", "nats://127.0.0.1:1"}, wantErr: "connection refused"},
		{name: "a missing stream is named", args: []string{"--pod", "p", "--stream", "NOPE"}, wantErr: "NOPE"},
		{name: "a namespace that is not a DNS label is named", args: []string{"-n", "Shop_1"}, wantErr: `--namespace: invalid namespace "Shop_1"`, wantUsage: true},
		{name: "a pod's namespace that is not a DNS label is named", args: []string{"--pod", "Shop/web-0"}, wantErr: `--pod: invalid namespace "Shop"`, wantUsage: true},
		{name: "a bad selector is named with its column", args: []string{"-n", "shop", "-l", "env in (prod"}, wantErr: `--selector: invalid label selector "env in (prod": column 13`, wantUsage: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr strings.Builder
			err := run(t.Context(), append([]string{"replay"}, tt.args...), env.lookup, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("replay %s = %v, want an error containing %q", strings.Join(tt.args, " "), err, tt.wantErr)
			}
			var ue *cli.UsageError
			if errors.As(err, &ue) != tt.wantUsage {
				t.Errorf("replay %s = %#v, want a usage error: %v", strings.Join(tt.args, " "), err, tt.wantUsage)
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
	if err := run(ctx, []string{"replay", "--since", "1h"}, env.lookup, &stdout, &stderr); err != nil {
		t.Errorf("replay with a canceled context = %v, want nil", err)
	}
}

func TestReplaySelectsByLabelsAndFailures(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	api := generator.Pod{UID: "cccc-3333", Namespace: "shop", Name: "api-0", Meta: &generator.PodMeta{Labels: map[string]string{"app": "api", "tier": "back"}}}
	front := generator.Pod{UID: "dddd-4444", Namespace: "shop", Name: "front-0", Meta: &generator.PodMeta{Labels: map[string]string{"app": "web", "tier": "front"}}}
	ok := lifecycle(generator.ContainerDied, front, "app", 3*time.Hour+2*time.Second)
	zero := int32(0)
	ok.ExitCode, ok.Reason = &zero, "Completed"
	env.publish(t, "node-1",
		lifecycle(generator.ContainerStarted, api, "app", 3*time.Hour),
		lifecycle(generator.ContainerStarted, front, "app", 3*time.Hour+time.Second),
		ok,
		lifecycle(generator.ContainerDied, api, "app", 3*time.Hour+3*time.Second))
	tests := []struct {
		args []string
		want []string // the pod and type of each line
	}{
		{args: []string{"-n", "shop", "-l", "app=web"}, want: []string{"ContainerStarted shop/front-0/app", "ContainerDied shop/front-0/app"}},
		{args: []string{"-n", "shop", "-l", "tier in (back,db),!canary"}, want: []string{"ContainerStarted shop/api-0/app", "ContainerDied shop/api-0/app"}},
		{args: []string{"-n", "shop", "--failed"}, want: []string{"ContainerDied shop/api-0/app"}},
		{args: []string{"-n", "shop", "-l", "app=web", "--failed"}},
	}
	for _, tt := range tests {
		var got []string
		for _, l := range replay(t, env, tt.args...) {
			f := strings.Fields(l)
			got = append(got, f[2]+" "+f[3])
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("replay %s printed (-want +got):\n%s", strings.Join(tt.args, " "), diff)
		}
	}
}

// A stream an upgraded bridge writes to still holds the events of its
// predecessor, on subjects without the namespace token: replay and tail
// read them beside the new ones, the namespace filter included.
func TestReplayAndTailReadBothSubjectLayouts(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	old := lifecycle(generator.ContainerStarted, web, "app", 3*time.Hour+4*time.Minute+5*time.Second)
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: testPrefix})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := enc.Encode(old)
	if err != nil {
		t.Fatal(err)
	}
	msg.Subject = schemas.LegacySubject(testPrefix, "node-1", web.UID, string(old.Type))
	if _, err := env.js.PublishMsg(t.Context(), msg); err != nil {
		t.Fatalf("publish %s: %v", msg.Subject, err)
	}
	env.publish(t, "node-1", lifecycle(generator.ContainerDied, web, "app", 3*time.Hour+9*time.Minute+500*time.Millisecond))
	env.publish(t, "node-2.example.com", lifecycle(generator.ContainerStarted, dns, "dns", 3*time.Hour+5*time.Minute+750*time.Millisecond))

	for _, args := range [][]string{{"-n", "default"}, {"--pod", "default/web-0"}, {"--pod", web.UID}} {
		if diff := cmp.Diff(dated(webStarted, webDied), replay(t, env, args...)); diff != "" {
			t.Errorf("replay %s printed (-want +got):\n%s", strings.Join(args, " "), diff)
		}
	}
	r := startTail(t, env, "--all", "-n", "default")
	if diff := cmp.Diff(dated(webStarted, webDied), readLines(t, r.lines, 2)); diff != "" {
		t.Errorf("tail --all -n default printed (-want +got):\n%s", diff)
	}
}

// TestReplayPrintsAnEventTheStreamHoldsTwiceOnce checks that an event its
// bridge published again after the servers lost it (the same CloudEvent,
// stored after the stream forgot its id) is printed once, and that the
// repeat is named on stderr.
func TestReplayPrintsAnEventTheStreamHoldsTwiceOnce(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	nc, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{Name: testStream, SubjectPrefix: testPrefix, DuplicateWindow: 100 * time.Millisecond}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	env := &testEnv{url: url, nc: nc, js: js}
	died := lifecycle(generator.ContainerDied, web, "app", 3*time.Hour+9*time.Minute+500*time.Millisecond)
	env.publish(t, "node-1", lifecycle(generator.ContainerStarted, web, "app", 3*time.Hour+4*time.Minute+5*time.Second))
	env.publish(t, "node-1", died)
	publishtest.WaitOutDuplicateWindow(t, js, testStream)
	env.publish(t, "node-1", died)
	s, err := js.Stream(t.Context(), testStream)
	if err != nil {
		t.Fatalf("look up stream: %v", err)
	}

	stdout, stderr := replayOutput(t, env, "--pod", "default/web-0")
	if diff := cmp.Diff(dated(webStarted, webDied), stdout); diff != "" {
		t.Errorf("replay printed (-want +got):\n%s", diff)
	}
	want := []string{fmt.Sprintf("pleg-bridge replay: skipped ContainerDied default/web-0/app at stream sequence %d, a repeat of sequence 2 (published again by its bridge after the NATS servers lost it)",
		s.CachedInfo().State.LastSeq)}
	if diff := cmp.Diff(want, stderr); diff != "" {
		t.Errorf("replay said on stderr (-want +got):\n%s", diff)
	}
}
