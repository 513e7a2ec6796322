//go:build k8s

package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// TestBridgeOnARealNode installs pleg-bridge twice, on a cluster without
// the Prometheus Operator's CRDs: with kubectl apply -k and a credentials
// file, and with helm install and an NKey seed, each time against a new
// NATS on the host requiring that credential and a new checkpoint; makes
// the kubelet create, restart, crash-loop and delete pods; deletes the
// bridge's pod in the middle; and checks that JetStream holds every
// transition of those pods once, in order, with the pod as the API shows
// it.
func TestBridgeOnARealNode(t *testing.T) {
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		t.Fatalf("%s holds %d entries before the tests: another bridge's checkpoint? The tests would overwrite it", dataDir, len(entries))
	}
	if out := kubectl(t, nil, "get", "crd", "-o", "name"); strings.Contains(string(out), "monitoring.coreos.com") {
		t.Fatalf("the cluster has the Prometheus Operator's CRDs; the installations are to be tried without them:\n%s", out)
	}
	// The data directory stays between the two installations, as on a node
	// where the bridge is uninstalled and installed again against another
	// NATS: the second bridge meets the first's checkpoint, of a stream its
	// NATS does not have, and must start that stream's history complete.
	t.Cleanup(func() { cleanDataDir(t) })
	for _, in := range []installer{kustomizeInstaller(), helmInstaller()} {
		t.Run(in.name, func(t *testing.T) {
			nats := startHostNATS(t, in.auth)
			in.install(t, nats)
			t.Cleanup(func() {
				if t.Failed() {
					bridgeLogs(t)
				}
				in.uninstall(t)
			})
			first := waitBridgeReady(t, "")
			checkRunsAsWritten(t, first)
			churn(t, in.churnNamespace, nats, string(first.UID))
			checkEveryHistoryStarts(t, nats)
		})
	}
}

// checkEveryHistoryStarts checks that the stream holds no container's Died
// or Removed without its Started before them: also for the containers of
// an earlier installation's pods, which a bridge that found a checkpoint
// of another stream reports in this one.
func checkEveryHistoryStarts(t *testing.T, nats *hostNATS) {
	t.Helper()
	first := map[string]string{}
	namespaces := map[string]bool{}
	for _, e := range streamEvents(t, nats) {
		if _, ok := first[e.ContainerID]; !ok {
			first[e.ContainerID] = e.LifecycleType()
			namespaces[e.Data.Pod.Namespace] = true
		}
	}
	for id, typ := range first {
		if typ != "ContainerStarted" {
			t.Errorf("container %s: the stream's first event of it is %s, want ContainerStarted", id, typ)
		}
	}
	t.Logf("%d containers of namespaces %v: each history starts with ContainerStarted", len(first), slices.Sorted(maps.Keys(namespaces)))
}

// The pods the tests create: the test image's work mode sleeps, then exits
// with a code; SIGTERM ends it early with 0.
type scenario struct {
	name          string
	restartPolicy corev1.RestartPolicy
	sleep         string
	exit          int
}

var (
	exitZero  = scenario{"exit-zero", corev1.RestartPolicyNever, "1s", 0}
	exitCode  = scenario{"exit-code", corev1.RestartPolicyNever, "1s", 3}
	crashLoop = scenario{"crash-loop", corev1.RestartPolicyOnFailure, "200ms", 2}
	restarts  = scenario{"restarts", corev1.RestartPolicyAlways, "1s", 0}
	long      = scenario{"long", corev1.RestartPolicyAlways, "1h", 0}
	// during runs and exits while the bridge is away.
	during = scenario{"during", corev1.RestartPolicyNever, "3s", 5}
)

const workImage = "localhost/pleg-e2e/work:1"

func (s scenario) pod(ns string) corev1.Pod {
	grace := int64(5)
	return corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: s.name, Namespace: ns,
			Labels: map[string]string{"app": "churn", "scenario": s.name, "example.com/tier": "e2e.node-test_1"},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 s.restartPolicy,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: workImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"work", "--sleep", s.sleep, "--exit", fmt.Sprint(s.exit)},
			}},
		},
	}
}

func createPods(t *testing.T, ns string, scenarios ...scenario) {
	t.Helper()
	list := corev1.List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, s := range scenarios {
		b, err := json.Marshal(s.pod(ns))
		if err != nil {
			t.Fatal(err)
		}
		list.Items = append(list.Items, runtime.RawExtension{Raw: b})
	}
	b, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, b, "create", "-f", "-")
}

// churn drives the pods of the scenarios through the API, deletes the
// bridge's pod (UID bridgeUID) in the middle, and checks the stream.
func churn(t *testing.T, ns string, nats *hostNATS, bridgeUID string) {
	kubectl(t, nil, "create", "namespace", ns)
	t.Cleanup(func() { _, _ = run(nil, suite.kubectl, "delete", "namespace", ns, "--wait=false") })
	w := watchPods(t, ns)

	// With the bridge up: exits, a crash loop and restarts.
	createPods(t, ns, exitZero, exitCode, crashLoop, restarts, long)
	w.wait(t, 2*time.Minute, "exits, restarts and a crash loop", func(pods map[string]*podState) error {
		for _, want := range []struct {
			name     string
			restarts int32
			done     bool
		}{{exitZero.name, 0, true}, {exitCode.name, 0, true}, {crashLoop.name, 3, false}, {restarts.name, 2, false}, {long.name, 0, false}} {
			p := byName(pods, want.name)
			switch {
			case p == nil:
				return fmt.Errorf("no pod %s yet", want.name)
			case p.restarts < want.restarts:
				return fmt.Errorf("%s restarted %d times", want.name, p.restarts)
			case want.done && !p.finished:
				return fmt.Errorf("%s has not finished", want.name)
			case want.name == long.name && !p.running:
				return fmt.Errorf("%s is not running", want.name)
			}
		}
		return nil
	})
	kubectl(t, nil, "-n", ns, "delete", "pod", crashLoop.name, restarts.name, "--wait", "--timeout=60s")

	// The bridge's pod deleted while a pod runs into its exit and two are
	// deleted: the new pod finds the checkpoint its predecessor left on the
	// node's hostPath.
	createPods(t, ns, during)
	w.wait(t, time.Minute, "the during pod running", func(pods map[string]*podState) error {
		if p := byName(pods, during.name); p == nil || !p.running {
			return errors.New("not running yet")
		}
		return nil
	})
	kubectl(t, nil, "-n", namespace, "delete", "pod", "-l", podSelector, "--wait=false")
	kubectl(t, nil, "-n", ns, "delete", "pod", long.name, exitZero.name, "--wait=false")
	outage := map[string]bool{long.name: true, exitZero.name: true}
	second := waitBridgeReady(t, bridgeUID)
	checkRunsAsWritten(t, second)
	w.wait(t, time.Minute, "the during pod's exit", func(pods map[string]*podState) error {
		if p := byName(pods, during.name); p == nil || !p.finished {
			return errors.New("not finished yet")
		}
		return nil
	})

	// Everything deleted. The kubelet removes the containers of a deleted
	// pod at once, its sandbox at its next garbage collection (within a
	// minute): the check takes containerd's word for what is gone.
	w.deleteAll(t, ns)
	truth := w.snapshot()
	if len(truth) != 6 {
		t.Fatalf("the watch saw %d pods, want 6", len(truth))
	}

	events, _, exitCodes := checkStream(t, nats, ns, truth, outage, 4)
	n := 0
	for _, e := range events {
		if e.Data.Pod.Namespace == ns {
			n++
		}
	}
	t.Logf("%d transitions of %d pods, all once and in order, %d exit codes as the API showed (%d events in the stream)",
		n, len(truth), exitCodes, len(events))
}

// checkStream waits, 90 s at most, for the stream to hold every
// transition of the pods of namespace ns that truth holds, once and in
// order (check), with at least minExitCodes exit codes as the API showed
// them, and returns the whole stream, the IDs containerd held when it
// was read and the number of exit codes compared. The stream converges on
// what containerd holds: dead containers and sandboxes not yet removed,
// the rest removed.
func checkStream(t *testing.T, nats *hostNATS, ns string, truth map[string]podTruth, outage map[string]bool, minExitCodes int) ([]consumer.Event, map[string]bool, int) {
	t.Helper()
	var problems []string
	var events []consumer.Event
	var present map[string]bool
	var exitCodes int
	waittest.Until(t, 90*time.Second, "the stream to hold every transition", func() (bool, error) {
		before := containerdIDs(t)
		events = streamEvents(t, nats)
		after := containerdIDs(t)
		if !maps.Equal(before, after) {
			return false, errors.New("containerd changed while the stream was read")
		}
		present = after
		problems, exitCodes = check(truth, events, after, ns, suite.node, outage)
		if len(problems) == 0 && exitCodes < minExitCodes {
			problems = append(problems, fmt.Sprintf("only %d exit codes compared with the API's", exitCodes))
		}
		if len(problems) == 0 {
			return true, nil
		}
		return false, fmt.Errorf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
	})
	return events, present, exitCodes
}

// podState is a pod's truth and what the watch last showed of it.
type podState struct {
	podTruth
	running  bool // the main container was last shown running
	finished bool // the main container was last shown terminated, not to restart
}

// podWatch follows the pods of a namespace with kubectl get --watch.
type podWatch struct {
	mu      sync.Mutex
	pods    map[string]*podState // by UID; guarded by mu
	changed chan struct{}        // closed at each change; guarded by mu
	err     error                // why the watch ended; guarded by mu
}

func watchPods(t *testing.T, ns string) *podWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, suite.kubectl, "-n", ns, "get", "pods", "--watch", "--output-watch-events", "-o", "json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+suite.kubeconfig)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &podWatch{pods: map[string]*podState{}, changed: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dec := json.NewDecoder(stdout)
		for {
			var ev struct {
				Type   string     `json:"type"`
				Object corev1.Pod `json:"object"`
			}
			err := dec.Decode(&ev)
			w.mu.Lock()
			if err != nil {
				w.err = fmt.Errorf("pod watch ended: %w", err)
			} else {
				w.update(ev.Type, ev.Object)
			}
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		<-done
	})
	return w
}

// update records a watch event; w.mu is held.
func (w *podWatch) update(typ string, pod corev1.Pod) {
	uid := string(pod.UID)
	p := w.pods[uid]
	if p == nil {
		p = &podState{podTruth: podTruth{uid: uid, name: pod.Name, exitCodes: map[string]int32{}}}
		w.pods[uid] = p
	}
	p.labels = pod.Labels
	if len(pod.Spec.Containers) > 0 {
		p.image = pod.Spec.Containers[0].Image
	}
	if typ == "DELETED" {
		p.deleted = true
	}
	for _, c := range pod.Status.ContainerStatuses {
		p.restarts = max(p.restarts, c.RestartCount)
		for _, s := range []corev1.ContainerState{c.State, c.LastTerminationState} {
			if s.Terminated != nil && s.Terminated.ContainerID != "" {
				p.exitCodes[strings.TrimPrefix(s.Terminated.ContainerID, "containerd://")] = s.Terminated.ExitCode
			}
		}
		p.running = c.State.Running != nil
		p.finished = c.State.Terminated != nil && pod.Spec.RestartPolicy == corev1.RestartPolicyNever
	}
}

// wait returns when cond holds for the pods seen, and fails the test at
// the timeout or if the watch ends, with cond's last error.
// deleteAll deletes every pod of ns and waits until the watch saw each go
// from the API.
func (w *podWatch) deleteAll(t *testing.T, ns string) {
	t.Helper()
	kubectl(t, nil, "-n", ns, "delete", "pods", "--all", "--wait", "--timeout=90s")
	w.wait(t, time.Minute, "every pod gone from the API", func(pods map[string]*podState) error {
		for _, p := range pods {
			if !p.deleted {
				return fmt.Errorf("%s not deleted yet", p.name)
			}
		}
		return nil
	})
}

func (w *podWatch) wait(t *testing.T, timeout time.Duration, what string, cond func(map[string]*podState) error) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		err, changed, watchErr := cond(w.pods), w.changed, w.err
		w.mu.Unlock()
		if err == nil {
			return
		}
		if watchErr != nil {
			t.Fatalf("%s: %v (last: %v)", what, watchErr, err)
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
	}
}

func (w *podWatch) snapshot() map[string]podTruth {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]podTruth{}
	for uid, p := range w.pods {
		out[uid] = p.podTruth
	}
	return out
}

func byName(pods map[string]*podState, name string) *podState {
	for _, p := range pods {
		if p.name == name && !p.deleted {
			return p
		}
	}
	return nil
}

// containerdIDs returns the IDs of the containers and sandboxes the node's
// containerd holds for the kubelet.
func containerdIDs(t *testing.T) map[string]bool {
	t.Helper()
	out, err := run(nil, suite.ctr, "--address", suite.socket, "-n", "k8s.io", "containers", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, id := range strings.Fields(string(out)) {
		ids[id] = true
	}
	return ids
}

// streamEvents reads the whole stream, in order.
func streamEvents(t *testing.T, nats *hostNATS) []consumer.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := nats.js.Stream(ctx, schemas.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var events []consumer.Event
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("read the stream up to %d: %v", last, err)
		}
		e, err := consumer.DecodeMsg(msg)
		if err != nil {
			t.Fatalf("decode stream message %s: %v", msg.Subject(), err)
		}
		events = append(events, e)
		if e.Sequence >= last {
			return events
		}
	}
}
