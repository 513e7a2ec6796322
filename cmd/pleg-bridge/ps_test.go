package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/statebucket"
	"github.com/pleg-bridge/pleg-bridge/statebucket/statebuckettest"
)

// psNow is the clock of the ps tests: the AGE column counts from it.
var psNow = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)

// psEnv is an in-process server with a state bucket that two nodes'
// state writers keep, as bridges do.
type psEnv struct {
	url    string
	js     jetstream.JetStream
	nodes  map[string]*statebucket.Writer
	bucket string
}

func newPSEnv(t *testing.T) *psEnv {
	t.Helper()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	return startStateWriters(t, url, js)
}

// startStateWriters keeps the state bucket STATE on the server at url with
// two nodes' state writers, until the test ends.
func startStateWriters(t *testing.T, url string, js jetstream.JetStream) *psEnv {
	t.Helper()
	e := &psEnv{url: url, js: js, nodes: map[string]*statebucket.Writer{}, bucket: "STATE"}
	for _, node := range []string{"node-1", "node-2.example.com"} {
		enc, err := publish.NewEncoder(publish.EncoderOptions{Node: node, SubjectPrefix: "pleg"})
		if err != nil {
			t.Fatal(err)
		}
		e.nodes[node] = statebuckettest.Start(t, js, statebucket.Options{Bucket: e.bucket, Encoder: enc, Manage: true})
	}
	return e
}

func (e *psEnv) getenv(key string) string {
	return map[string]string{"PLEG_NATS_URL": e.url, "PLEG_STATE_BUCKET": e.bucket}[key]
}

// psEvent is the event typ of container name (empty: the sandbox) of pod,
// started age before psNow.
func psEvent(typ generator.LifecycleEventType, pod generator.Pod, name string, age time.Duration) generator.Event {
	started := psNow.Add(-age)
	ev := generator.Event{
		Type: typ, Pod: pod,
		Container: generator.Container{ID: pod.UID + "-" + cmpOr(name, "sandbox"), Name: name, Sandbox: name == ""},
		StartedAt: started, Time: started, DetectedBy: generator.SourceRelist, ObservedAt: started,
	}
	if name == "app" {
		ev.Container.Attempt = 2 // restarted twice
	}
	switch typ {
	case generator.ContainerStarted:
		ev.State = generator.StateRunning
	case generator.ContainerDied:
		code := int32(137)
		ev.State, ev.ExitCode, ev.Reason, ev.FinishedAt = generator.StateExited, &code, "OOMKilled", psNow
	case generator.ContainerRemoved:
		ev.State = generator.StateRemoved
	}
	return ev
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var (
	psWeb = generator.Pod{UID: "aaaa-1111", Namespace: "default", Name: "web-0"}
	psJob = generator.Pod{UID: "cccc-3333", Namespace: "default", Name: "job-1"}
	psDNS = generator.Pod{UID: "bbbb-2222", Namespace: "kube-system", Name: "dns-0"}
)

// seed records a running web-0 and an OOM-killed job-1 on node-1, and a
// running dns-0 on node-2.example.com, and waits until the bucket holds
// their six containers.
func (e *psEnv) seed(t *testing.T) {
	t.Helper()
	n1, n2 := e.nodes["node-1"], e.nodes["node-2.example.com"]
	n1.Record(psEvent(generator.ContainerStarted, psWeb, "", 5*time.Minute))
	n1.Record(psEvent(generator.ContainerStarted, psWeb, "app", 5*time.Minute))
	n1.Record(psEvent(generator.ContainerStarted, psJob, "run", 2*time.Hour))
	n1.Record(psEvent(generator.ContainerDied, psJob, "run", 2*time.Hour))
	n2.Record(psEvent(generator.ContainerStarted, psDNS, "", 72*time.Hour))
	n2.Record(psEvent(generator.ContainerStarted, psDNS, "dns", 72*time.Hour))
	e.waitEntries(t, 5)
}

// waitEntries follows the bucket until it holds n containers.
func (e *psEnv) waitEntries(t *testing.T, n int) {
	t.Helper()
	publishtest.WaitStream(t, e.js, "KV_"+e.bucket)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	keys := map[string]bool{}
	synced := false
	_ = consumer.WatchState(ctx, e.js, consumer.StateOptions{Bucket: e.bucket}, func(ch consumer.StateChange) error {
		switch ch.Op {
		case consumer.StateSynced:
			synced = true
		case consumer.StateRemoved:
			delete(keys, ch.Container.Key)
		default:
			keys[ch.Container.Key] = true
		}
		if synced && len(keys) == n {
			cancel()
		}
		return nil
	})
	if len(keys) != n {
		t.Fatalf("the bucket holds %d containers, want %d", len(keys), n)
	}
}

func TestPSPrintsTheCurrentContainersAsATable(t *testing.T) {
	t.Parallel()
	e := newPSEnv(t)
	e.seed(t)
	tests := []struct {
		name     string
		args     []string
		want     []string
		wantNote string
	}{
		{
			name: "the running containers of the cluster, without sandboxes",
			want: []string{
				"NODE                 NAMESPACE     POD     CONTAINER   STATE     EXIT   RESTARTS   AGE",
				"node-1               default       web-0   app         running          2          5m",
				"node-2.example.com   kube-system   dns-0   dns         running          0          3d",
			},
		},
		{
			name: "all containers of a node, exited ones with their exit code",
			args: []string{"--node", "node-1", "--all"},
			want: []string{
				"NODE     NAMESPACE   POD     CONTAINER   STATE     EXIT              RESTARTS   AGE",
				"node-1   default     job-1   run         exited    137 (OOMKilled)   0          120m",
				"node-1   default     web-0   app         running                     2          5m",
			},
		},
		{
			name: "a pod by namespace/name with its sandbox",
			args: []string{"--pod", "default/web-0", "--sandboxes"},
			want: []string{
				"NODE     NAMESPACE   POD     CONTAINER   STATE     EXIT   RESTARTS   AGE",
				"node-1   default     web-0   (sandbox)   running          0          5m",
				"node-1   default     web-0   app         running          2          5m",
			},
		},
		{
			name: "a pod by UID",
			args: []string{"--pod", psDNS.UID},
			want: []string{
				"NODE                 NAMESPACE     POD     CONTAINER   STATE     EXIT   RESTARTS   AGE",
				"node-2.example.com   kube-system   dns-0   dns         running          0          3d",
			},
		},
		{
			name:     "a namespace that matches nothing says so",
			args:     []string{"--namespace", "nope"},
			want:     []string{"NODE   NAMESPACE   POD   CONTAINER   STATE   EXIT   RESTARTS   AGE"},
			wantNote: "no running containers match --namespace nope\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if err := psRun(t.Context(), tt.args, e.getenv, &stdout, &stderr, func() time.Time { return psNow }); err != nil {
				t.Fatalf("ps %q: %v (stderr %q)", tt.args, err, stderr.String())
			}
			if diff := cmp.Diff(tt.want, strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")); diff != "" {
				t.Errorf("ps %q (-want +got):\n%s", tt.args, diff)
			}
			if stderr.String() != tt.wantNote {
				t.Errorf("ps %q stderr %q, want %q", tt.args, stderr.String(), tt.wantNote)
			}
		})
	}
}

func TestPSJSONIsOneObjectALineWithTheLatestCloudEvent(t *testing.T) {
	t.Parallel()
	e := newPSEnv(t)
	e.seed(t)
	var stdout, stderr bytes.Buffer
	if err := psRun(t.Context(), []string{"--json", "--all", "--pod", "default/job-1"}, e.getenv, &stdout, &stderr, time.Now); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Op, Node, Namespace, Pod, PodUID string
		Event                            struct {
			Type string
			Data struct{ ExitCode int }
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("ps --json printed %q: %v", stdout.String(), err)
	}
	if got.Op != "listed" || got.Node != "node-1" || got.Pod != "job-1" || got.PodUID != psJob.UID ||
		got.Event.Type != "pleg.v1.ContainerDied" || got.Event.Data.ExitCode != 137 {
		t.Errorf("ps --json = %+v", got)
	}
}

func TestPSRefusesBadFlagsAndNamesAMissingBucket(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	getenv := func(k string) string { return map[string]string{"PLEG_NATS_URL": url}[k] }
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--pod", "a/b/c"}, `--pod "a/b/c"`},
		{[]string{"--pod", "/web-0"}, "namespace/name"},
		{[]string{"--pod", "shop/web-0", "--namespace", "other"}, "not in --namespace"},
		{[]string{"extra"}, "unexpected argument"},
		{nil, "state bucket PLEG_STATE not found"},
	} {
		err := psRun(t.Context(), tt.args, getenv, io.Discard, io.Discard, time.Now)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ps %q = %v, want an error with %q", tt.args, err, tt.want)
		}
	}
}

// TestPSWatchPrintsChangesAfterTheList follows default's pods: after the
// table, a container that dies and one that is removed each print a row
// until ps is interrupted, which returns nil.
func TestPSWatchPrintsChangesAfterTheList(t *testing.T) {
	t.Parallel()
	e := newPSEnv(t)
	e.seed(t)
	r, w := io.Pipe()
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- psRun(ctx, []string{"--namespace", "default", "--watch"}, e.getenv, w, io.Discard, func() time.Time { return psNow })
		w.Close()
	}()
	next := func() string {
		t.Helper()
		select {
		case l := <-lines:
			return l
		case <-time.After(waitTimeout):
			t.Fatal("ps --watch printed no line within the timeout")
			return ""
		}
	}
	for _, want := range []string{
		"NODE     NAMESPACE   POD     CONTAINER   STATE     EXIT              RESTARTS   AGE",
		"node-1   default     web-0   app         running                     2          5m",
	} {
		if got := next(); got != want {
			t.Fatalf("line %q, want %q", got, want)
		}
	}
	n1 := e.nodes["node-1"]
	n1.Record(psEvent(generator.ContainerDied, psWeb, "app", 5*time.Minute))
	if got, want := next(), "node-1   default     web-0   app         exited    137 (OOMKilled)   2          5m"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	n1.Record(psEvent(generator.ContainerRemoved, psJob, "run", 2*time.Hour))
	// A removal is named from the container's last entry.
	if got, want := next(), "node-1   default     job-1   run         removed   137 (OOMKilled)   0"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ps --watch after interrupt = %v, want nil", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("ps --watch did not return after interrupt")
	}
}

func TestHumanAgeReadsAsKubectlsAgeColumn(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second:                   "0s",
		45 * time.Second:               "45s",
		119 * time.Second:              "119s",
		5*time.Minute + 30*time.Second: "5m30s",
		5 * time.Minute:                "5m",
		2 * time.Hour:                  "120m",
		3*time.Hour + 20*time.Minute:   "3h20m",
		30 * time.Hour:                 "30h",
		4*24*time.Hour + 5*time.Hour:   "4d5h",
		3 * 24 * time.Hour:             "3d",
		30 * 24 * time.Hour:            "30d",
	} {
		if got := humanAge(d); got != want {
			t.Errorf("humanAge(%s) = %q, want %q", d, got, want)
		}
	}
}

// psRun runs ps with args as the command line does, its AGE column computed
// with now.
func psRun(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, now func() time.Time) error {
	env := commandEnv{lookup: func(k string) (string, bool) { v := getenv(k); return v, v != "" }, stdout: stdout, stderr: stderr}
	c := psCommand(env, now)
	c.SetArgs(append([]string{}, args...)) // nil would make cobra read os.Args
	c.SetOut(stdout)
	c.SetErr(stderr)
	c.SilenceErrors, c.SilenceUsage = true, true
	return c.ExecuteContext(ctx)
}

// TestPSEndsQuietlyWhenItsReaderGoesAway is ps --json | head -c 100: the
// write fails with EPIPE and ps ends with status 0, as tail and replay do;
// another write error is reported.
func TestPSEndsQuietlyWhenItsReaderGoesAway(t *testing.T) {
	t.Parallel()
	e := newPSEnv(t)
	e.seed(t)
	brokenPipe := &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}
	diskFull := &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.ENOSPC}
	for _, args := range [][]string{{"--json"}, {}} {
		if err := psRun(t.Context(), args, e.getenv, failingWriter{brokenPipe}, io.Discard, func() time.Time { return psNow }); err != nil {
			t.Errorf("ps %q into a closed pipe = %v, want nil", args, err)
		}
		err := psRun(t.Context(), args, e.getenv, failingWriter{diskFull}, io.Discard, func() time.Time { return psNow })
		if err == nil || !strings.Contains(err.Error(), "write to stdout") {
			t.Errorf("ps %q onto a full disk = %v, want a write error", args, err)
		}
	}
}
