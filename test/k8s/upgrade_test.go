//go:build k8s

package k8s

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// TestUpgradesLoseNothing rolls the bridge's DaemonSet from one build to
// another with Helm while the kubelet starts, kills and removes pods, and
// checks that JetStream holds every transition of those pods once and in
// order (check), none lost across the rollout, and that the new bridge
// took up the data directory the old one left (its checkpoint and its
// spool) rather than starting afresh:
//
//  1. helm upgrade from this checkout's build to the same source stamped
//     with another version, with NATS away from before the rollout until
//     the new pod runs: the old bridge spools what it cannot publish, the
//     new one publishes it;
//  2. helm install of the last commit before the checkpoint named its
//     stream (run.sh's old_commit), with that commit's chart, then helm
//     upgrade to this chart and build over its data directory;
//  3. helm rollback to it: the old build on the data directory this
//     build wrote; and helm upgrade again.
//
// It runs after the other tests: it needs the node's data directory empty,
// and leaves it so.
func TestUpgradesLoseNothing(t *testing.T) {
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		t.Fatalf("%s holds %d entries before the upgrade tests: another bridge's checkpoint? The tests would overwrite it", dataDir, len(entries))
	}
	t.Cleanup(func() { cleanDataDir(t) })
	chart := filepath.Join(suite.repo, "deploy", "helm", "pleg-bridge")

	t.Run("helm upgrade to another build with NATS away", func(t *testing.T) {
		nats := startHostNATS(t, authNKey)
		installRelease(t, nats, release{chart: chart, image: suite.image, auth: authNKey})
		rollWhileChurning(t, nats, "churn-upgrade", rollout{
			name:     "helm upgrade to " + suite.imageB,
			image:    suite.imageB,
			natsAway: true,
			do: func(t *testing.T) {
				helmRelease(t, "upgrade", release{chart: chart, image: suite.imageB, auth: authNKey})
			},
		})
	})

	t.Run("helm upgrade from the previous format and rollback", func(t *testing.T) {
		// The old build starts as on a new node.
		cleanDataDir(t)
		nats := startHostNATS(t, authCreds)
		installRelease(t, nats, release{chart: suite.oldChart, image: suite.imageOld, auth: authCreds, oldChart: true})
		rollWhileChurning(t, nats, "churn-from-old", rollout{
			name:  "helm upgrade from " + suite.oldCommit,
			image: suite.image,
			do: func(t *testing.T) {
				helmRelease(t, "upgrade", release{chart: chart, image: suite.image, auth: authCreds})
			},
		})
		// Revision 1 is the old chart with the old image: the downgrade.
		rollWhileChurning(t, nats, "churn-rollback", rollout{
			name:    "helm rollback to " + suite.oldCommit,
			image:   suite.imageOld,
			version: suite.oldCommit,
			do: func(t *testing.T) {
				if _, err := run(nil, suite.helm, "rollback", releaseName, "1", "--namespace", namespace); err != nil {
					t.Fatal(err)
				}
			},
		})
		// And up again: this build on the checkpoint whose stream it
		// named before the rollback, the sequence the old build moved on.
		rollWhileChurning(t, nats, "churn-upgrade-again", rollout{
			name:  "helm upgrade again after the rollback",
			image: suite.image,
			do: func(t *testing.T) {
				helmRelease(t, "upgrade", release{chart: chart, image: suite.image, auth: authCreds})
			},
		})
	})
}

const releaseName = "pleg-bridge"

// release is what helm install or upgrade gives the chart: what a user
// changes (docs/deployment.md), as helmInstaller does.
type release struct {
	chart, image string
	auth         natsAuth
	// oldChart is a chart of before the NKey values, whose podMonitor and
	// prometheusRule default to true: the cluster has no Prometheus
	// Operator.
	oldChart bool
}

// helmRelease runs helm install or helm upgrade (verb) of r.
func helmRelease(t *testing.T, verb string, r release) {
	t.Helper()
	repo, tag := imageRepoTag(t, r.image)
	registry, repository, _ := strings.Cut(repo, "/")
	args := []string{verb, releaseName, r.chart, "--namespace", namespace,
		"--set", "image.registry=" + registry, "--set", "image.repository=" + repository,
		"--set-string", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "criSocket=" + suite.socket}
	if r.auth == authNKey {
		args = append(args, "--set", "nats.credsKey=", "--set", "nats.nkeySeedKey=nkey.seed")
	}
	// One NATS server: the state bucket cannot have the default 3
	// replicas (docs/deployment.md).
	args = append(args, "--set", "streamReplicas=1")
	if r.oldChart {
		args = append(args, "--set", "podMonitor.enabled=false", "--set", "prometheusRule.enabled=false")
	}
	if _, err := run(nil, suite.helm, args...); err != nil {
		t.Fatal(err)
	}
}

// installRelease creates the namespace and the Secret for nats, installs
// r, and waits for the bridge's pod Ready; the release and the namespace
// go at the end of the test.
func installRelease(t *testing.T, nats *hostNATS, r release) {
	t.Helper()
	createNamespaceAndSecret(t, nats)
	t.Cleanup(func() {
		if t.Failed() {
			bridgeLogs(t)
		}
		if _, err := run(nil, suite.helm, "uninstall", releaseName, "--namespace", namespace, "--wait"); err != nil {
			t.Error(err)
		}
		kubectl(t, nil, "delete", "namespace", namespace, "--wait", "--timeout=120s")
	})
	helmRelease(t, "install", r)
	waitBridgeReady(t, "")
}

// rollout is a change of the DaemonSet's pod.
type rollout struct {
	name  string
	image string // that the new pod runs
	// version is what the new bridge says it is; empty: any but the old
	// one's.
	version string
	// natsAway stops NATS before the rollout, once the old bridge holds
	// events it could not publish, and starts it again once the new pod
	// runs.
	natsAway bool
	do       func(t *testing.T)
}

// Churn before the rollout, and after it: this many pods created and
// deleted.
const churnAround = 4

// rollWhileChurning churns pods in namespace ns (a new one), rolls the
// bridge's pod (r) in the middle, churns on, deletes every pod and checks
// the stream against what the API and containerd showed, and the new
// bridge's log and metrics for a resumed start.
func rollWhileChurning(t *testing.T, nats *hostNATS, ns string, r rollout) {
	t.Helper()
	kubectl(t, nil, "create", "namespace", ns)
	t.Cleanup(func() { _, _ = run(nil, suite.kubectl, "delete", "namespace", ns, "--wait=false") })
	w := watchPods(t, ns)
	// Where the time goes, for the log: churn before, the rollout, churn
	// after, the drain, the check.
	var stages []string
	mark := time.Now()
	stage := func(name string) {
		now := time.Now()
		stages = append(stages, fmt.Sprintf("%s %s", name, now.Sub(mark).Round(100*time.Millisecond)))
		mark = now
	}
	c := startChurn(t, ns, w)
	old := waitBridgeReady(t, "")
	oldLog := readBridgeLog(t, old)
	c.waitDone(t, 0, churnAround, "pods churned before the "+r.name)
	stage("churn before")

	seqStart := lastSeq(t, nats)
	var spooled float64
	if r.natsAway {
		nats.stop()
		waittest.Until(t, time.Minute, "the old bridge to spool what it cannot publish", func() (bool, error) {
			v, err := metric(old, "pleg_bridge_spool_events")
			spooled = v
			return err == nil && v > 0, err
		})
	}
	start := time.Now()
	c.beginOutage()
	r.do(t)
	if r.natsAway {
		waittest.Until(t, 2*time.Minute, "the new bridge's pod running", func() (bool, error) {
			for _, p := range bridgePods(t) {
				if p.UID != old.UID && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
					return true, nil
				}
			}
			return false, nil
		})
		nats.restart(t)
	}
	next := waitBridgeReady(t, string(old.UID))
	took := time.Since(start)
	outage := c.endOutage()
	seqReady := lastSeq(t, nats)
	if got := next.Spec.Containers[0].Image; got != r.image {
		t.Fatalf("after the %s the bridge's pod runs %s, want %s", r.name, got, r.image)
	}
	nextLog := readBridgeLog(t, next)
	checkResumed(t, r, oldLog, nextLog, seqStart)
	stage("rollout")
	// Pods the rollout held back are deleted at once: the churn after it
	// counts the pods created after it.
	c.waitDone(t, c.createdSoFar(), churnAround, "pods churned after the "+r.name)
	stage("churn after")
	c.stop(t)
	// A pod deleted before the kubelet made its sandbox has no container
	// to report: the last ones created run first.
	w.wait(t, time.Minute, "every pod running or done", func(pods map[string]*podState) error {
		for _, p := range pods {
			if !p.deleted && !p.running && !p.finished && p.restarts == 0 {
				return fmt.Errorf("%s not running yet", p.name)
			}
		}
		return nil
	})

	w.deleteAll(t, ns)
	stage("drain")
	truth := w.snapshot()
	events, present, exitCodes := checkStream(t, nats, ns, truth, outage, 4)
	stage("check")
	var before, during, after int
	ids := map[string]bool{}
	for _, e := range events {
		if e.Data.Pod.Namespace != ns {
			continue
		}
		ids[e.ContainerID] = true
		switch {
		case e.Sequence <= seqStart:
			before++
		case e.Sequence <= seqReady:
			during++
		default:
			after++
		}
	}
	// What the kubelet made: a sandbox and restarts+1 containers a pod,
	// each Started, Died and, but for those containerd still holds,
	// Removed.
	containers := 0
	for _, p := range truth {
		containers += int(p.restarts) + 2
	}
	made := 3 * containers
	for id := range ids {
		if present[id] {
			made--
		}
	}
	for _, l := range readBridgeLog(t, next).errors {
		t.Errorf("the bridge after the %s logged an error: %s", r.name, l)
	}
	duplicates, err := metric(next, `pleg_bridge_publish_total{result="duplicate"}`)
	if err != nil {
		t.Error(err)
	}
	// A rollout stops the old bridge gracefully: it writes every ack it
	// had before it goes, so the new one publishes nothing again. A
	// duplicate is a transition published twice, which the stream's
	// duplicate window hides from check.
	if duplicates != 0 {
		t.Errorf("the bridge after the %s published %v events that the stream held already", r.name, duplicates)
	}
	away := ""
	if r.natsAway {
		away = fmt.Sprintf(", NATS away from before it (%v events spooled by the old bridge) until the new pod ran", spooled)
	}
	t.Logf("%s: %d transitions made (%d containers of %d pods), %d in the stream, each once and in order, none missing "+
		"(%d before the rollout, %d while it ran, %d after; %d exit codes as the API showed; %d pods deleted while no bridge was Ready); "+
		"the rollout took %s to the new pod Ready%s; the new bridge published %v duplicates; time: %s",
		r.name, made, containers, len(truth), before+during+after, before, during, after, exitCodes, len(outage),
		took.Round(100*time.Millisecond), away, duplicates, strings.Join(stages, ", "))
}

// checkResumed checks in the log of the bridge after the rollout that it
// is another build than before and took up the data directory: the
// checkpoint with containers and a stream sequence of at least seqStart
// (the stream's when the rollout began: what the old bridge published,
// it wrote before it went), and (natsAway) events in the spool; not set
// aside.
func checkResumed(t *testing.T, r rollout, oldLog, nextLog bridgeLog, seqStart uint64) {
	t.Helper()
	switch {
	case nextLog.version == "":
		t.Errorf("the bridge after the %s did not log its version", r.name)
	case r.version != "" && nextLog.version != r.version:
		t.Errorf("the bridge after the %s is version %q, want %q", r.name, nextLog.version, r.version)
	case nextLog.version == oldLog.version:
		t.Errorf("the bridge after the %s is version %q, as before", r.name, nextLog.version)
	}
	for _, l := range nextLog.warnings {
		t.Logf("the bridge after the %s warned: %s", r.name, l)
	}
	if nextLog.setAside != "" {
		t.Errorf("the bridge after the %s set its data directory aside: %s", r.name, nextLog.setAside)
	}
	o := nextLog.opened
	if o == nil {
		t.Fatalf("the bridge after the %s did not log that it opened its durable state", r.name)
	}
	containers, _ := o["containers"].(float64)
	sequence, _ := o["sequence"].(float64)
	spool, _ := o["spool_entries"].(float64)
	if containers == 0 || sequence == 0 {
		t.Errorf("the bridge after the %s opened a checkpoint of %v containers at sequence %v: a fresh start, not the old one's", r.name, containers, sequence)
	}
	if sequence < float64(seqStart) {
		t.Errorf("the bridge after the %s opened a checkpoint at sequence %v; the stream was at %d when the rollout began", r.name, sequence, seqStart)
	}
	if r.natsAway && spool == 0 {
		t.Errorf("the bridge after the %s found no spool entries, though NATS was away", r.name)
	}
	t.Logf("%s: version %q, then %q: opened durable state %v", r.name, oldLog.version, nextLog.version, o)
}

// bridgeLog is what the tests read in a bridge's log (JSON lines).
type bridgeLog struct {
	version  string         // of "pleg-bridge starting"
	opened   map[string]any // the line "opened durable state"
	setAside string         // the line saying the durable state was set aside
	warnings []string       // the lines at level WARN
	errors   []string       // the lines at level ERROR
}

// readBridgeLog reads the log of the bridge's pod.
func readBridgeLog(t *testing.T, pod corev1.Pod) bridgeLog {
	t.Helper()
	out := kubectl(t, nil, "-n", namespace, "logs", pod.Name)
	var l bridgeLog
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		switch {
		case msg == "pleg-bridge starting":
			l.version, _ = m["version"].(string)
		case msg == "opened durable state":
			l.opened = m
		case strings.HasPrefix(msg, "set the durable state aside"):
			l.setAside = sc.Text()
		}
		switch m["level"] {
		case "WARN":
			l.warnings = append(l.warnings, sc.Text())
		case "ERROR":
			l.errors = append(l.errors, sc.Text())
		}
	}
	return l
}

// metric returns the value of the sample named (with its labels, as the
// exposition writes them) from the bridge pod's /metrics.
func metric(pod corev1.Pod, sample string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(pod.Status.PodIP, "9470") + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", url, err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), sample+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no sample %s in %s", sample, url)
}

// lastSeq returns the stream's last sequence.
func lastSeq(t *testing.T, nats *hostNATS) uint64 {
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
	return info.State.LastSeq
}

// The churn: a pod created every churnPeriod, in turn of these scenarios,
// each deleted once done (finished, or restarted once), and one pod that
// runs across the rollout.
var (
	churnScenarios = []scenario{
		{"quick", corev1.RestartPolicyNever, "300ms", 0},
		{"fails", corev1.RestartPolicyNever, "1s", 3},
		{"crash", corev1.RestartPolicyOnFailure, "300ms", 2},
		{"slow", corev1.RestartPolicyNever, "4s", 4},
		{"again", corev1.RestartPolicyAlways, "1s", 0},
	}
	churnLong = scenario{"long", corev1.RestartPolicyAlways, "1h", 0}
)

// churnPeriod paces the churn: a pod a second keeps the node busy
// without outrunning the kubelet on a small machine.
const churnPeriod = time.Second

// churner creates and deletes pods until stopped. A container created
// and removed while no bridge runs is never seen by any (a relist sees
// what is listed): while a rollout runs, only the pods shown running
// before it are deleted, so that every container is seen by a bridge.
type churner struct {
	ns     string
	w      *podWatch
	cancel context.CancelFunc
	end    chan struct{} // closed when the goroutine returns

	mu        sync.Mutex
	created   int             // pods created by the churn; guarded by mu
	index     map[string]int  // by name, the order in which the churn created a pod; guarded by mu
	deleted   map[string]bool // by name; guarded by mu
	runBefore map[string]bool // during a rollout, the pods shown running or done before it; nil otherwise; guarded by mu
	outage    map[string]bool // pods deleted during the rollout; guarded by mu
	err       error           // why the churn stopped; guarded by mu
}

// startChurn creates the long pod and starts the churn; stop ends it.
func startChurn(t *testing.T, ns string, w *podWatch) *churner {
	t.Helper()
	createPods(t, ns, churnLong)
	ctx, cancel := context.WithCancel(context.Background())
	c := &churner{ns: ns, w: w, cancel: cancel, end: make(chan struct{}), index: map[string]int{}, deleted: map[string]bool{}}
	go c.run(ctx)
	t.Cleanup(func() {
		cancel()
		<-c.end
	})
	return c
}

func (c *churner) run(ctx context.Context) {
	defer close(c.end)
	tick := time.NewTicker(churnPeriod)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s := churnScenarios[n%len(churnScenarios)]
		s.name = fmt.Sprintf("%s-%d", s.name, n)
		err := createPod(s.pod(c.ns))
		c.mu.Lock()
		c.index[s.name] = n
		c.created = n + 1
		c.mu.Unlock()
		if err == nil {
			err = c.deleteDone()
		}
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
	}
}

func createPod(pod corev1.Pod) error {
	b, err := json.Marshal(pod)
	if err != nil {
		return err
	}
	_, err = run(b, suite.kubectl, "create", "-f", "-")
	return err
}

// deleteDone deletes the pods that finished or restarted, but, while a
// rollout runs, those not shown running before it.
func (c *churner) deleteDone() error {
	var names []string
	c.w.mu.Lock()
	c.mu.Lock()
	for _, p := range c.w.pods {
		if p.deleted || c.deleted[p.name] || p.name == churnLong.name || !(p.finished || p.restarts > 0) {
			continue
		}
		if c.runBefore != nil && !c.runBefore[p.name] {
			continue
		}
		names = append(names, p.name)
		c.deleted[p.name] = true
		if c.outage != nil {
			c.outage[p.name] = true
		}
	}
	c.mu.Unlock()
	c.w.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	_, err := run(nil, suite.kubectl, append([]string{"-n", c.ns, "delete", "pod", "--wait=false"}, names...)...)
	return err
}

// beginOutage marks the start of a rollout.
func (c *churner) beginOutage() {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runBefore = map[string]bool{}
	c.outage = map[string]bool{}
	for _, p := range c.w.pods {
		if p.running || p.finished || p.restarts > 0 {
			c.runBefore[p.name] = true
		}
	}
}

// endOutage marks the end of a rollout (the new bridge Ready) and returns
// the pods deleted during it: no bridge may have seen their containers'
// exit codes.
func (c *churner) endOutage() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.outage
	c.runBefore, c.outage = nil, nil
	return out
}

// createdSoFar returns how many pods the churn created.
func (c *churner) createdSoFar() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created
}

// waitDone waits for n pods deleted by the churn among those it created
// from the since-th on, and fails the test if the churn stopped on an
// error.
func (c *churner) waitDone(t *testing.T, since, n int, what string) {
	t.Helper()
	waittest.Until(t, 2*time.Minute, what, func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		done := 0
		for name := range c.deleted {
			if c.index[name] >= since {
				done++
			}
		}
		if c.err != nil || done >= n {
			return true, nil
		}
		return false, fmt.Errorf("%d pods done, want %d", done, n)
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		t.Fatalf("%s: the churn stopped: %v", what, c.err)
	}
}

// stop ends the churn and fails the test if it had stopped on an error.
func (c *churner) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	<-c.end
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil && !errors.Is(c.err, context.Canceled) {
		t.Fatalf("the churn stopped: %v", c.err)
	}
}
