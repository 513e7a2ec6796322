//go:build k8s && k8sfreeze

// Not yet seen passing on a real node, so test/k8s/run.sh (tag k8s alone)
// leaves it out; the tag k8sfreeze builds it in, for the next run of it.

package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
)

// restartSlack is what the bound on a frozen bridge's life allows, beyond
// the liveness probe's own times, for the kubelet to notice the failure,
// stop the container and start the next one (a first restart is not
// backed off).
const restartSlack = 10 * time.Second

// The pods of the freeze: containers that exit 0 after a second or so,
// restarted by the kubelet, and pods that run to their end while the
// bridge is stopped.
var (
	freezeChurnA = scenario{"churn-a", corev1.RestartPolicyAlways, "1s", 0}
	freezeChurnB = scenario{"churn-b", corev1.RestartPolicyAlways, "1500ms", 0}
	frozenGone   = scenario{"frozen-gone", corev1.RestartPolicyNever, "1s", 0} // created and deleted while frozen
	frozenDone   = scenario{"frozen-done", corev1.RestartPolicyNever, "1s", 0} // created while frozen, kept
	afterFreeze  = scenario{"after-freeze", corev1.RestartPolicyNever, "1s", 0}
)

// TestAFrozenBridgeIsReplaced installs the bridge (kubectl apply -k), runs
// pods whose containers exit and are restarted, SIGSTOPs the bridge's
// process on the node, and checks that the kubelet's liveness probe
// replaces it within the time its settings give (periodSeconds x
// failureThreshold + timeoutSeconds + the probe's
// terminationGracePeriodSeconds + restartSlack), that the stream then holds
// every transition of the pods once and in order, as the API and
// containerd show them, and that no pod of the churn failed.
func TestAFrozenBridgeIsReplaced(t *testing.T) {
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		t.Fatalf("%s holds %d entries before the test: another bridge's checkpoint? The test would overwrite it", dataDir, len(entries))
	}
	t.Cleanup(func() { cleanDataDir(t) })
	in := kustomizeInstaller()
	nats := startHostNATS(t, in.auth)
	in.install(t, nats)
	t.Cleanup(func() {
		if t.Failed() {
			bridgeLogs(t)
		}
		in.uninstall(t)
	})
	bridge := waitBridgeReady(t, "")
	bound := livenessBound(t, bridge)

	ns := "churn-freeze"
	kubectl(t, nil, "create", "namespace", ns)
	t.Cleanup(func() { _, _ = run(nil, suite.kubectl, "delete", "namespace", ns, "--wait=false") })
	w := watchPods(t, ns)
	createPods(t, ns, freezeChurnA, freezeChurnB)
	w.wait(t, time.Minute, "the churn restarting", func(pods map[string]*podState) error {
		for _, s := range []scenario{freezeChurnA, freezeChurnB} {
			if p := byName(pods, s.name); p == nil || p.restarts < 1 {
				return fmt.Errorf("%s has not restarted yet", s.name)
			}
		}
		return nil
	})

	// The freeze: the bridge's process stopped on the node, as a starved
	// or hung process would be; it can handle no signal but SIGKILL.
	oldID, restartsBefore := bridgeContainer(t, bridge)
	pid := taskPID(t, oldID)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the bridge's process %d: %v", pid, err)
	}
	frozen := time.Now()
	t.Cleanup(func() {
		// Only if the test ended before the kubelet killed it.
		if processStopped(pid, oldID) {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	t.Logf("SIGSTOPped the bridge's process %d (container %s, %d restarts); replaced within %v, the probe settings say", pid, oldID, restartsBefore, bound)

	// The churn goes on while the bridge is stopped: containers exit and
	// restart, a pod runs to its end, another is deleted after its end.
	createPods(t, ns, frozenGone, frozenDone)
	w.wait(t, time.Minute, "the pods created during the freeze to finish", func(pods map[string]*podState) error {
		for _, s := range []scenario{frozenGone, frozenDone} {
			if p := byName(pods, s.name); p == nil || !p.finished {
				return fmt.Errorf("%s has not finished yet", s.name)
			}
		}
		return nil
	})
	kubectl(t, nil, "-n", ns, "delete", "pod", frozenGone.name, "--wait=false")
	stillFrozen := processStopped(pid, oldID)

	var replaced time.Duration
	var newID string
	var startedAt time.Time
	waittest.Until(t, bound+time.Minute, "the kubelet to replace the frozen bridge", func() (bool, error) {
		var pod corev1.Pod
		if err := json.Unmarshal(kubectl(t, nil, "-n", namespace, "get", "pod", bridge.Name, "-o", "json"), &pod); err != nil {
			t.Fatal(err)
		}
		if len(pod.Status.ContainerStatuses) != 1 {
			return false, fmt.Errorf("%d container statuses", len(pod.Status.ContainerStatuses))
		}
		c := pod.Status.ContainerStatuses[0]
		id := strings.TrimPrefix(c.ContainerID, "containerd://")
		if c.RestartCount <= restartsBefore || id == oldID || c.State.Running == nil {
			return false, fmt.Errorf("restarts %d, container %s, state %+v", c.RestartCount, id, c.State)
		}
		replaced, newID, startedAt = time.Since(frozen), id, c.State.Running.StartedAt.Time
		return true, nil
	})
	t.Logf("the new bridge container %s runs %v after the SIGSTOP (seen by polling the API; its startedAt, to the second, %v after it); the bound is %v",
		newID, replaced.Round(100*time.Millisecond), startedAt.Sub(frozen).Round(time.Second), bound)
	if replaced > bound {
		t.Errorf("the frozen bridge was replaced %v after the SIGSTOP, more than the %v its probe settings give", replaced, bound)
	}
	if !stillFrozen {
		t.Errorf("the bridge's process was no longer stopped when the pods created during the freeze had ended and one was deleted: the freeze did not cover them")
	}
	waitBridgeReady(t, "")

	// After the replacement: a pod runs to its end, the churn restarts on,
	// then everything is deleted.
	createPods(t, ns, afterFreeze)
	w.wait(t, 2*time.Minute, "the pod created after the replacement to finish and the churn to restart 3 times", func(pods map[string]*podState) error {
		if p := byName(pods, afterFreeze.name); p == nil || !p.finished {
			return fmt.Errorf("%s has not finished yet", afterFreeze.name)
		}
		for _, s := range []scenario{freezeChurnA, freezeChurnB} {
			if p := byName(pods, s.name); p == nil || p.restarts < 3 {
				return fmt.Errorf("%s restarted %d times, want 3", s.name, restartsOf(p))
			}
		}
		return nil
	})
	checkNoPodFailed(t, ns)
	w.deleteAll(t, ns)
	truth := w.snapshot()
	if len(truth) != 5 {
		t.Fatalf("the watch saw %d pods, want 5", len(truth))
	}
	for _, p := range truth {
		for id, code := range p.exitCodes {
			if code != 0 {
				t.Errorf("%s: container %s exited with %d, every container of the churn exits with 0", p.name, id, code)
			}
		}
	}
	events, _, exitCodes := checkStream(t, nats, ns, truth, map[string]bool{frozenGone.name: true}, 4)
	n, containers := 0, map[string]bool{}
	for _, e := range events {
		if e.Data.Pod.Namespace == ns {
			n++
			containers[e.ContainerID] = true
		}
	}
	t.Logf("%d transitions of %d containers and sandboxes of %d pods, each once and in order (0 missing, 0 duplicated), %d exit codes as the API showed",
		n, len(containers), len(truth), exitCodes)
}

// livenessBound returns how long the bridge's pod's liveness probe lets a
// frozen bridge live: the first failed probe at most periodSeconds after the
// freeze, failureThreshold failures periodSeconds apart, the last one after
// timeoutSeconds, the kill after the probe's terminationGracePeriodSeconds
// (a stopped process handles no SIGTERM), then restartSlack.
func livenessBound(t *testing.T, pod corev1.Pod) time.Duration {
	t.Helper()
	p := pod.Spec.Containers[0].LivenessProbe
	if p == nil || p.TerminationGracePeriodSeconds == nil {
		t.Fatalf("the bridge's liveness probe %+v has no terminationGracePeriodSeconds: a frozen bridge would wait the pod's grace", p)
	}
	s := time.Duration(p.PeriodSeconds*p.FailureThreshold+p.TimeoutSeconds) + time.Duration(*p.TerminationGracePeriodSeconds)
	return s*time.Second + restartSlack
}

// bridgeContainer returns the ID and restart count of the bridge pod's
// container.
func bridgeContainer(t *testing.T, pod corev1.Pod) (string, int32) {
	t.Helper()
	if len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("the bridge's pod has %d containers", len(pod.Status.ContainerStatuses))
	}
	c := pod.Status.ContainerStatuses[0]
	return strings.TrimPrefix(c.ContainerID, "containerd://"), c.RestartCount
}

// taskPID returns the host PID of the task of container id, as containerd
// lists it.
func taskPID(t *testing.T, id string) int {
	t.Helper()
	out, err := run(nil, suite.ctr, "--address", suite.socket, "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("task of %s: pid %q", id, f[1])
			}
			return pid
		}
	}
	t.Fatalf("no task for container %s in:\n%s", id, out)
	return 0
}

// processStopped reports whether process pid is stopped (state T) and is
// still the process of container id (its cgroup names the container).
func processStopped(pid int, id string) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	cgroup, err := os.ReadFile(filepath.Join(dir, "cgroup"))
	if err != nil || !strings.Contains(string(cgroup), id) {
		return false
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, the state follows the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(string(stat[i+1:])), "T")
}

func restartsOf(p *podState) int32 {
	if p == nil {
		return 0
	}
	return p.restarts
}

// checkNoPodFailed fails the test if a pod of ns failed, a container of it
// waits for another reason than its creation or its crash loop's backoff
// (the containers exit 0 on purpose), or the kubelet reported a warning
// other than that backoff: a sandbox or container it could not create or
// start beside the frozen bridge.
func checkNoPodFailed(t *testing.T, ns string) {
	t.Helper()
	var pods corev1.PodList
	if err := json.Unmarshal(kubectl(t, nil, "-n", ns, "get", "pods", "-o", "json"), &pods); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodFailed {
			t.Errorf("pod %s failed: %s %s", p.Name, p.Status.Reason, p.Status.Message)
		}
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil && w.Reason != "ContainerCreating" && w.Reason != "CrashLoopBackOff" {
				t.Errorf("pod %s: container %s waits: %s %s", p.Name, c.Name, w.Reason, w.Message)
			}
		}
	}
	var events corev1.EventList
	if err := json.Unmarshal(kubectl(t, nil, "-n", ns, "get", "events", "--field-selector", "type=Warning", "-o", "json"), &events); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	for _, e := range events.Items {
		if e.Reason != "BackOff" {
			warnings = append(warnings, fmt.Sprintf("%s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message))
		}
	}
	if len(warnings) > 0 {
		t.Errorf("the kubelet warned about the churn's pods:\n%s", strings.Join(warnings, "\n"))
	}
	if len(pods.Items) == 0 {
		t.Error("no pod of the churn left to check")
	}
}
