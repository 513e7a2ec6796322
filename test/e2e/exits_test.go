//go:build e2e

package e2e

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// envExitBench sets the bursts TestExitBurst measures: comma-separated
// SIZExREPETITIONS, e.g. "1x20,10x5,100x2" (BENCHMARKS.md's table). Unset:
// one burst of 10.
const envExitBench = "PLEG_E2E_EXIT_BENCH"

// perPod is how many containers of a burst share a pod.
const perPod = 10

// burst is one size of TestExitBurst's plan.
type burst struct{ size, reps int }

func exitPlan(t *testing.T) []burst {
	t.Helper()
	spec := os.Getenv(envExitBench)
	if spec == "" {
		return []burst{{10, 1}}
	}
	var plan []burst
	for _, item := range strings.Split(spec, ",") {
		size, reps, ok := strings.Cut(strings.TrimSpace(item), "x")
		n, err1 := strconv.Atoi(size)
		r, err2 := strconv.Atoi(reps)
		if !ok || err1 != nil || err2 != nil || n < 1 || r < 1 {
			t.Fatalf("%s=%q: %q is not SIZExREPETITIONS (e.g. 10x5)", envExitBench, spec, item)
		}
		plan = append(plan, burst{n, r})
	}
	return plan
}

// stoppedEvents records when the test's own GetContainerEvents stream
// received each container's CONTAINER_STOPPED_EVENT: the runtime's own
// report of an exit, the floor of any bridge that waits for CRI. Only on
// containerd 2.x, where a second subscriber takes nothing from the kubelet
// (and from the bridges).
type stoppedEvents struct {
	mu sync.Mutex
	at map[string]time.Time // guarded by mu
}

func followStopped(t *testing.T, c *cri) *stoppedEvents {
	t.Helper()
	stream, err := c.rt.GetContainerEvents(t.Context(), &runtimeapi.GetEventsRequest{}, waitForReady)
	if err != nil {
		t.Fatalf("GetContainerEvents: %v", err)
	}
	s := &stoppedEvents{at: map[string]time.Time{}}
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			if ev.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
				now := time.Now()
				s.mu.Lock()
				if _, ok := s.at[ev.GetContainerId()]; !ok {
					s.at[ev.GetContainerId()] = now
				}
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// followTaskExits records when the test's own subscription to
// containerd's event service received each container's /tasks/exit: the
// floor of any subscriber, on every containerd version.
func followTaskExits(t *testing.T, c *cri) *stoppedEvents {
	t.Helper()
	return followTask(t, c, "/tasks/exit", func(b []byte) (string, bool) {
		var exit eventtypes.TaskExit
		if proto.Unmarshal(b, &exit) != nil || exit.GetID() != exit.GetContainerID() {
			return "", false // an exec's exit
		}
		return exit.GetContainerID(), true
	})
}

// followTaskStarts records when the test's own subscription to
// containerd's event service received each container's /tasks/start: the
// runtime's own start event.
func followTaskStarts(t *testing.T, c *cri) *stoppedEvents {
	t.Helper()
	return followTask(t, c, "/tasks/start", func(b []byte) (string, bool) {
		var start eventtypes.TaskStart
		if proto.Unmarshal(b, &start) != nil {
			return "", false
		}
		return start.GetContainerID(), true
	})
}

// followTask records when the test's own subscription to containerd's
// event service received the first event of topic for each container that
// id names.
func followTask(t *testing.T, c *cri, topic string, id func([]byte) (string, bool)) *stoppedEvents {
	t.Helper()
	sub, err := eventsapi.NewEventsClient(c.conn).Subscribe(t.Context(), &eventsapi.SubscribeRequest{
		Filters: []string{`namespace=="k8s.io",topic=="` + topic + `"`},
	}, waitForReady)
	if err != nil {
		t.Fatalf("subscribe to containerd's events: %v", err)
	}
	// containerd sends no header before the first event: the burst's
	// start, seconds long, leaves the subscription time to be in place.
	s := &stoppedEvents{at: map[string]time.Time{}}
	go func() {
		for {
			env, err := sub.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			cid, ok := id(env.GetEvent().GetValue())
			if !ok {
				continue
			}
			s.mu.Lock()
			if _, ok := s.at[cid]; !ok {
				s.at[cid] = now
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *stoppedEvents) get(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.at[id]
	return at, ok
}

// TestExitBurst makes bursts of containers exit together (each sleeps until
// the same instant, then exits with code 0 to 3) and follows them with two
// bridges in auto mode at once: one that reports exits from containerd's
// task exits (the default) and one that waits for CRI
// (PLEG_EXITS_FROM_CRI=true), the same exits for both. Each bridge must
// report every exit once, with the exit code, finish time (to the
// nanosecond) and reason CRI reports afterwards, and no task-event
// mismatch. It logs finished_at → stored in JetStream, p50/p90/p99, for
// both, beside the arrival of the runtime's own STOPPED event on
// containerd 2.x.
func TestExitBurst(t *testing.T) {
	plan := exitPlan(t)
	c := newCRI(t)
	// At Info, as in production: logging each event at Debug costs the
	// CPU the latency is measured on.
	after := startBridge(t, "auto", c.prefix, "PLEG_LOG_LEVEL=info")
	// The comparison: on containerd 2.x, containerd-events mode, the feed
	// that cannot hold the runtime back; on 1.7, where auto follows
	// containerd's events, auto waiting for CRI's exits.
	beforeMode, beforeEnv := "containerd-events", []string{"PLEG_LOG_LEVEL=info"}
	if strings.HasPrefix(suite.version, "1.") {
		beforeMode, beforeEnv = "auto", append(beforeEnv, "PLEG_EXITS_FROM_CRI=true")
	}
	before := startBridge(t, beforeMode, c.prefix, beforeEnv...)
	var stopped *stoppedEvents
	if !strings.HasPrefix(suite.version, "1.") {
		stopped = followStopped(t, c)
	}
	exits := followTaskExits(t, c)
	starts := followTaskStarts(t, c)
	want := map[string]expected{}
	type row struct {
		b                          burst
		after, before, floor, exit []time.Duration
		// startAfter and startBefore are /tasks/start's arrival at the
		// test → ContainerStarted stored, for the two bridges.
		startAfter, startBefore []time.Duration
	}
	var rows []row
	round := 0
	for _, b := range plan {
		r := row{b: b}
		for range b.reps {
			round++
			pods, ids, statuses := runBurst(t, c, round, b.size)
			for i, id := range ids {
				st := statuses[i]
				fin := time.Unix(0, st.FinishedAt)
				for _, br := range []*bridge{after, before} {
					died := br.events.waitEvent("ContainerDied", id, eventTimeout)
					if died.Data.ExitCode == nil || *died.Data.ExitCode != st.ExitCode || died.Data.FinishedAt == nil ||
						!died.Data.FinishedAt.Equal(fin) || died.Data.Reason != st.Reason {
						t.Errorf("%s: %s finishedAt %v; CRI says exit %d reason %q finished %v", br.name(), died, died.Data.FinishedAt,
							st.ExitCode, st.Reason, fin)
					}
					d := died.stored.Sub(fin)
					if br == after {
						r.after = append(r.after, d)
					} else {
						r.before = append(r.before, d)
					}
				}
				if at, ok := starts.get(id); ok {
					r.startAfter = append(r.startAfter, after.events.waitEvent("ContainerStarted", id, eventTimeout).stored.Sub(at))
					r.startBefore = append(r.startBefore, before.events.waitEvent("ContainerStarted", id, eventTimeout).stored.Sub(at))
				} // else: the test's subscription was not in place yet; a floor, not a check
				if at, ok := exits.get(id); ok {
					r.exit = append(r.exit, at.Sub(fin))
				} else {
					t.Errorf("the test's subscription to containerd's events got no /tasks/exit of %s", id)
				}
				if stopped != nil {
					// containerd 2.x drops events for a subscriber it
					// finds slow: a floor, not a check.
					if at, ok := stopped.get(id); ok {
						r.floor = append(r.floor, at.Sub(fin))
					}
				}
			}
			for i, p := range pods {
				mine := ids[i*perPod : min(len(ids), (i+1)*perPod)]
				want[p.id] = expected{subject: podNamespace + "/" + p.name, sandbox: true}
				for j, id := range mine {
					want[id] = expected{subject: fmt.Sprintf("%s/%s/c%02d", podNamespace, p.name, j), status: statuses[i*perPod+j],
						exit: statuses[i*perPod+j].ExitCode}
				}
			}
			var wg sync.WaitGroup
			errs := make([]error, len(pods))
			for i, p := range pods {
				wg.Go(func() { errs[i] = c.tryTeardown(p, ids[i*perPod:min(len(ids), (i+1)*perPod)]...) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		rows = append(rows, r)
	}
	fromTask := after.scrape(`pleg_bridge_containerd_triggers_total{result="died"}`)
	for _, br := range []*bridge{after, before} {
		br.events.waitCount(3*len(want), eventTimeout)
		check(t, br.mode, br.final(), want)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "containerd %s: %s → stored in JetStream, p50 / p90 / p99 (ms)\n", suite.version, "finished_at (deaths), /tasks/start's arrival (starts)")
	fmt.Fprintf(&sb, "| burst | exits | died, auto (default) | died, %s | runtime's STOPPED event | /tasks/exit reaches a subscriber | started, auto | started, %s |\n", before.name(), before.name())
	fmt.Fprintf(&sb, "|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		floor := "–"
		if stopped != nil {
			floor = percentiles(r.floor)
			if n := len(r.after) - len(r.floor); n > 0 {
				floor += fmt.Sprintf(" (%d not received)", n)
			}
		}
		fmt.Fprintf(&sb, "| %d | %d | %s | %s | %s | %s | %s | %s |\n", r.b.size, len(r.after), percentiles(r.after), percentiles(r.before), floor,
			percentiles(r.exit), percentiles(r.startAfter), percentiles(r.startBefore))
	}
	t.Logf("exit latency table:\n%s(deaths reported from the task exit: %v)", sb.String(), fromTask)
}

// runBurst starts size containers, perPod to a pod, that all exit at the
// same instant with codes 0 to 3, and returns the pods, the containers'
// IDs and their CRI statuses once all are exited.
func runBurst(t *testing.T, c *cri, round, size int) ([]pod, []string, []*runtimeapi.ContainerStatus) {
	t.Helper()
	npods := (size + perPod - 1) / perPod
	pods := make([]pod, npods)
	ids := make([]string, size)
	errs := make([]error, size+npods)
	// Long enough for every container to start first on a busy 2-CPU
	// machine: starting one takes 100-300 ms there.
	until := time.Now().Add(3*time.Second + time.Duration(size)*300*time.Millisecond)
	arg := until.UTC().Format(time.RFC3339Nano)
	var wg sync.WaitGroup
	for i := range npods {
		wg.Go(func() { pods[i], errs[size+i] = c.tryRunPod(fmt.Sprintf("burst-%d-%d", round, i)) })
	}
	wg.Wait()
	for _, err := range errs[size:] {
		if err != nil {
			t.Fatal(err)
		}
	}
	sem := make(chan struct{}, 8)
	for i := range size {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ids[i], errs[i] = c.tryStart(pods[i/perPod], fmt.Sprintf("c%02d", i%perPod), nil, "work", "--until", arg, "--exit", fmt.Sprint(i%4))
		})
	}
	wg.Wait()
	for _, err := range errs[:size] {
		if err != nil {
			t.Fatal(err)
		}
	}
	if late := time.Since(until); late > -100*time.Millisecond {
		t.Fatalf("starting %d containers took until %v after the instant they were to exit together: the machine is too slow for this burst", size, late)
	}
	statuses := make([]*runtimeapi.ContainerStatus, size)
	for i, id := range ids {
		waittest.Until(t, time.Until(until)+eventTimeout, fmt.Sprintf("container %s to exit", id), func() (bool, error) {
			st := c.status(id)
			statuses[i] = st
			return st.State == runtimeapi.ContainerState_CONTAINER_EXITED, fmt.Errorf("it is %v", st.State)
		})
	}
	return pods, ids, statuses
}

// percentiles formats the p50, p90 and p99 of ds (nearest rank) in ms.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "–"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) string {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return fmt.Sprintf("%.1f", float64(s[max(0, i)])/float64(time.Millisecond))
	}
	return at(0.50) + " / " + at(0.90) + " / " + at(0.99)
}

// TestOOMKilled runs a container that allocates memory past its limit of
// 32 MiB: the kernel's OOM killer ends it, and the bridge reports its
// death with reason OOMKilled, from the task's exit after containerd's
// /tasks/oom, as CRI reports it. Where the machine does not enforce
// memory limits (no memory controller for containerd's cgroups), the
// container is not OOM-killed, and the test says so and stops there.
func TestOOMKilled(t *testing.T) {
	c := newCRI(t)
	b := startBridge(t, "auto", c.prefix)
	p := c.runPod("oom")
	id, err := c.tryStart(p, "hog", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}, "hog")
	if err != nil {
		t.Fatal(err)
	}
	died := b.events.waitEvent("ContainerDied", id, eventTimeout)
	st := c.exitedStatus(id)
	t.Logf("containerd %s: the runtime reports exit %d reason %q; the bridge published %s", suite.version, st.ExitCode, st.Reason, died)
	if st.Reason != "OOMKilled" {
		t.Skipf("containerd %s on this machine did not OOM-kill a container limited to 32 MiB (exit %d, reason %q): memory limits are not enforced here",
			suite.version, st.ExitCode, st.Reason)
	}
	if died.Data.Reason != "OOMKilled" || died.Data.DetectedBy != "evented" {
		t.Errorf("published %s, want reason OOMKilled from the task's exit (detected by evented)", died)
	}
	c.remove(id)
	c.stopPod(p)
	c.removePod(p)
	want := map[string]expected{
		p.id: {subject: podNamespace + "/oom", sandbox: true},
		id:   {subject: podNamespace + "/oom/hog", status: st, exit: st.ExitCode, reason: "OOMKilled"},
	}
	b.events.waitCount(3*len(want), eventTimeout)
	check(t, "auto", b.final(), want)
}
