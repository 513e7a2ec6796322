//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Bounds of the waits. They are generous: the machine may be busy, and a
// failure names what it waited for.
const eventTimeout = 60 * time.Second

// maxLatency bounds the time from the runtime's timestamp (started_at,
// finished_at) to the event's JetStream timestamp; a test that holds the
// bridge back raises it by the hold for its own check.
var maxLatency = 15 * time.Second

// modes returns the bridge modes to test on the suite's containerd: every
// source on 2.x; on 1.7 generic and auto, which must never open the CRI
// event stream there and follows containerd's own events instead.
func modes() []string {
	if strings.HasPrefix(suite.version, "1.") {
		return []string{"generic", "auto"}
	}
	return []string{"generic", "evented", "containerd-events"}
}

// effective is the mode that mode amounts to on the suite's containerd:
// auto follows containerd's events on 1.x and the CRI stream on 2.x.
func effective(mode string) string {
	if mode != "auto" {
		return mode
	}
	if strings.HasPrefix(suite.version, "1.") {
		return "containerd-events"
	}
	return "evented"
}

// triggered says whether mode follows containerd's event service on the
// suite's containerd.
func triggered(mode string) bool { return effective(mode) == "containerd-events" }

// expected is what the stream must say about one container or sandbox.
type expected struct {
	subject string
	sandbox bool
	status  *runtimeapi.ContainerStatus // the runtime's last status of a container, nil for a sandbox
	exit    int32                       // exit code of a container
	reason  string                      // reason of a container's exit, "" not checked
}

// check asserts that evs holds, for every container and sandbox in want and
// nothing else, ContainerStarted, ContainerDied and ContainerRemoved exactly
// once and in that order, with the runtime's exit codes and timestamps, and
// logs the latency from the runtime's timestamps to JetStream's.
func check(t *testing.T, mode string, evs []event, want map[string]expected) {
	t.Helper()
	byID := map[string][]event{}
	for _, e := range evs {
		if _, ok := want[e.ContainerID]; !ok {
			t.Errorf("unexpected event #%d for %s: %s", e.Sequence, e.ContainerID, e)
			continue
		}
		byID[e.ContainerID] = append(byID[e.ContainerID], e)
		if e.Node != "e2e-node" || e.Source != "/nodes/e2e-node" {
			t.Errorf("event #%d: node %q source %q", e.Sequence, e.Node, e.Source)
		}
		// Containers' exits come from containerd's task exits, in every
		// mode that follows events; the rest, following containerd's
		// events, from relists.
		fromTask := e.LifecycleType() == "ContainerDied" && mode != "generic"
		if (mode == "generic" || triggered(mode)) && e.Data.DetectedBy != "relist" && !fromTask {
			t.Errorf("event #%d in %s mode detected by %q, want relist: %s", e.Sequence, mode, e.Data.DetectedBy, e)
		}
	}
	detected := map[string]int{}
	for _, e := range evs {
		detected[e.Data.DetectedBy]++
	}
	t.Logf("containerd %s, %s mode: %d events, detected by %v", suite.version, mode, len(evs), detected)
	lat := map[string][]time.Duration{}
	for id, w := range want {
		got := byID[id]
		var types []string
		for _, e := range got {
			types = append(types, e.LifecycleType())
		}
		if !slices.Equal(types, []string{"ContainerStarted", "ContainerDied", "ContainerRemoved"}) {
			t.Errorf("%s (%.12s): events %v, want ContainerStarted, ContainerDied, ContainerRemoved once each, in order:\n%s",
				w.subject, id, types, list(got))
			continue
		}
		for _, e := range got {
			if e.Subject != w.subject || e.Data.Container.Sandbox != w.sandbox {
				t.Errorf("event #%d: subject %q sandbox %v, want %q %v", e.Sequence, e.Subject, e.Data.Container.Sandbox, w.subject, w.sandbox)
			}
		}
		started, died := got[0], got[1]
		if w.sandbox {
			lat["sandbox started (created_at)"] = append(lat["sandbox started (created_at)"], started.stored.Sub(started.Time))
			continue
		}
		if died.Data.ExitCode == nil || *died.Data.ExitCode != w.exit || died.Data.State != "exited" {
			t.Errorf("%s: %s, state %q; want exit=%d, state exited", w.subject, died, died.Data.State, w.exit)
		}
		if w.reason != "" && died.Data.Reason != w.reason {
			t.Errorf("%s: reason %q, want %q", w.subject, died.Data.Reason, w.reason)
		}
		if s := w.status; s != nil {
			if s.ExitCode != w.exit {
				t.Errorf("%s: the runtime says exit code %d, the test expected %d", w.subject, s.ExitCode, w.exit)
			}
			if died.Data.Reason != s.Reason {
				t.Errorf("%s: reason %q, the runtime says %q", w.subject, died.Data.Reason, s.Reason)
			}
			checkTime(t, w.subject+" startedAt", started.Data.StartedAt, s.StartedAt)
			checkTime(t, w.subject+" finishedAt", died.Data.FinishedAt, s.FinishedAt)
			if !started.Time.Equal(time.Unix(0, s.StartedAt)) || !died.Time.Equal(time.Unix(0, s.FinishedAt)) {
				t.Errorf("%s: CloudEvent times %v, %v; the runtime's started_at, finished_at %v, %v", w.subject,
					started.Time, died.Time, time.Unix(0, s.StartedAt), time.Unix(0, s.FinishedAt))
			}
		}
		if started.Data.StartedAt != nil {
			lat["container started (started_at)"] = append(lat["container started (started_at)"], started.stored.Sub(*started.Data.StartedAt))
		}
		if died.Data.FinishedAt != nil && w.reason != "Unknown" {
			lat["container died (finished_at)"] = append(lat["container died (finished_at)"], died.stored.Sub(*died.Data.FinishedAt))
		}
	}
	for _, kind := range []string{"sandbox started (created_at)", "container started (started_at)", "container died (finished_at)"} {
		reportLatency(t, mode, kind, lat[kind])
	}
}

func checkTime(t *testing.T, what string, got *time.Time, ns int64) {
	t.Helper()
	if ns <= 0 {
		if got != nil {
			t.Errorf("%s = %v; the runtime gives none", what, *got)
		}
		return
	}
	if got == nil || !got.Equal(time.Unix(0, ns)) {
		t.Errorf("%s = %v, the runtime says %v", what, got, time.Unix(0, ns))
	}
}

// reportLatency logs the distribution of the delays from the runtime's
// timestamps to JetStream's, and fails beyond maxLatency.
func reportLatency(t *testing.T, mode, kind string, lat []time.Duration) {
	t.Helper()
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("containerd %s, %s mode, %s → JetStream, %d events: min %v, median %v, p90 %v, max %v",
		suite.version, mode, kind, len(lat), lat[0].Round(time.Millisecond), lat[len(lat)/2].Round(time.Millisecond),
		lat[len(lat)*9/10].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	if max := lat[len(lat)-1]; max > maxLatency {
		t.Errorf("latency up to %v, want at most %v", max, maxLatency)
	}
}

// checkSubscription asserts from the bridge's /metrics which event source
// it holds open. pleg_bridge_cri_requests_total counts a stream when it
// ends, so the gauges pleg_bridge_cri_stream_connected and
// pleg_bridge_containerd_events_connected are what show an open one.
func checkSubscription(t *testing.T, b *bridge) {
	t.Helper()
	m := b.scrape("pleg_bridge_")
	var opened []string
	for k, v := range m {
		if strings.HasPrefix(k, "pleg_bridge_cri_requests_total{") && strings.Contains(k, `operation="GetContainerEvents"`) && v != "0" {
			opened = append(opened, k+" "+v)
		}
	}
	cri, ctrd := m["pleg_bridge_cri_stream_connected"], m["pleg_bridge_containerd_events_connected"]
	t.Logf("%s mode: pleg_bridge_cri_stream_connected %s, pleg_bridge_containerd_events_connected %s, mode generic=%s evented=%s, GetContainerEvents requests %v",
		b.mode, cri, ctrd, m[`pleg_bridge_mode{mode="generic"}`], m[`pleg_bridge_mode{mode="evented"}`], opened)
	switch {
	case effective(b.mode) == "evented":
		if cri != "1" || ctrd != "0" {
			t.Errorf("evented mode: CRI stream connected %q, containerd events connected %q; want 1 and 0", cri, ctrd)
		}
	case triggered(b.mode):
		if len(opened) != 0 || cri != "0" {
			t.Errorf("%s mode on containerd %s opened GetContainerEvents: %v, pleg_bridge_cri_stream_connected %q",
				b.mode, suite.version, opened, cri)
		}
		if ctrd != "1" || m[`pleg_bridge_event_source{source="containerd"}`] != "1" {
			t.Errorf("%s mode on containerd %s: pleg_bridge_containerd_events_connected %q, event source %q; want subscribed to containerd's events",
				b.mode, suite.version, ctrd, m[`pleg_bridge_event_source{source="containerd"}`])
		}
	default: // generic
		if len(opened) != 0 || cri != "0" || ctrd != "0" {
			t.Errorf("generic mode on containerd %s subscribed: GetContainerEvents %v, CRI stream %q, containerd events %q",
				suite.version, opened, cri, ctrd)
		}
		if g := m[`pleg_bridge_mode{mode="generic"}`]; g != "1" {
			t.Errorf("generic mode on containerd %s: pleg_bridge_mode{mode=\"generic\"} = %q, want 1", suite.version, g)
		}
	}
}

// TestContainerLifecycle runs one pod through a kubelet's usual calls:
// containers that exit 0 after less than a second, exit 3, and are killed
// (StopContainer with timeout 0: SIGKILL, 137), then removal of everything.
func TestContainerLifecycle(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode, func(t *testing.T) {
			c := newCRI(t)
			b := startBridge(t, mode, c.prefix)
			p := c.runPod("lifecycle")
			quick := c.startWork(p, "quick", 300*time.Millisecond, 0)
			three := c.startWork(p, "three", 1500*time.Millisecond, 3)
			killed := c.startWork(p, "killed", time.Hour, 0)
			b.events.waitEvent("ContainerStarted", killed, eventTimeout)
			c.stop(killed, 0)

			want := map[string]expected{p.id: {subject: podNamespace + "/lifecycle", sandbox: true}}
			for _, k := range []struct {
				id, name string
				exit     int32
			}{{quick, "quick", 0}, {three, "three", 3}, {killed, "killed", 137}} {
				b.events.waitEvent("ContainerDied", k.id, eventTimeout)
				want[k.id] = expected{subject: podNamespace + "/lifecycle/" + k.name, status: c.exitedStatus(k.id), exit: k.exit}
			}
			checkSubscription(t, b)
			for _, id := range []string{quick, three, killed} {
				c.remove(id)
			}
			c.stopPod(p)
			c.removePod(p)
			b.events.waitCount(3*len(want), eventTimeout)
			check(t, mode, b.final(), want)
		})
	}
}

// TestTwentyPodsAtOnce starts 20 pods with a container each at the same
// time, lets the containers exit with various codes, and removes them all
// at the same time.
func TestTwentyPodsAtOnce(t *testing.T) {
	const n = 20
	for _, mode := range modes() {
		t.Run(mode, func(t *testing.T) {
			c := newCRI(t)
			b := startBridge(t, mode, c.prefix)
			pods := make([]pod, n)
			ids := make([]string, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					name := fmt.Sprintf("pod-%02d", i)
					if pods[i], errs[i] = c.tryRunPod(name); errs[i] == nil {
						ids[i], errs[i] = c.tryStartWork(pods[i], "app", 2*time.Second, i%5)
					}
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			want := map[string]expected{}
			for i := range n {
				b.events.waitEvent("ContainerDied", ids[i], eventTimeout)
				want[pods[i].id] = expected{subject: podNamespace + "/" + pods[i].name, sandbox: true}
				want[ids[i]] = expected{subject: podNamespace + "/" + pods[i].name + "/app", status: c.exitedStatus(ids[i]), exit: int32(i % 5)}
			}
			for i := range n {
				wg.Go(func() { errs[i] = c.tryTeardown(pods[i], ids[i]) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			b.events.waitCount(3*len(want), eventTimeout)
			check(t, mode, b.final(), want)
		})
	}
}

// TestRuntimeRestart stops containerd while containers run, lets one of
// them exit while it is down, and starts it again: the stream ends up
// complete, with that container's exit as the runtime reports it afterwards
// (containerd gives it no event, and says exit code 255, reason Unknown).
func TestRuntimeRestart(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode, func(t *testing.T) {
			c := newCRI(t)
			b := startBridge(t, mode, c.prefix)
			p := c.runPod("restart")
			survivor := c.startWork(p, "survivor", time.Hour, 0)
			early := c.startWork(p, "early", 2*time.Second, 7)
			b.events.waitEvent("ContainerStarted", survivor, eventTimeout)
			b.events.waitEvent("ContainerStarted", early, eventTimeout)
			pid := c.pid(early)

			containerd(t, "kill-daemon", suite.workdir)
			down := time.Now()
			waitProcessExit(t, pid, 30*time.Second)
			containerd(t, "start", suite.version, suite.workdir)
			t.Logf("containerd was down for %v", time.Since(down).Round(time.Millisecond))
			c.reconnect()

			b.events.waitEvent("ContainerDied", early, eventTimeout)
			st := c.exitedStatus(early)
			t.Logf("after the restart the runtime reports the early container: state %v, exit code %d, reason %q",
				st.State, st.ExitCode, st.Reason)
			c.stop(survivor, 0)
			b.events.waitEvent("ContainerDied", survivor, eventTimeout)
			want := map[string]expected{
				p.id:     {subject: podNamespace + "/restart", sandbox: true},
				survivor: {subject: podNamespace + "/restart/survivor", status: c.exitedStatus(survivor), exit: 137},
				early:    {subject: podNamespace + "/restart/early", status: st, exit: st.ExitCode, reason: st.Reason},
			}
			if st.ExitCode != 255 || st.Reason != "Unknown" {
				t.Logf("note: containerd reported exit %d reason %q, not the 255/Unknown measured before", st.ExitCode, st.Reason)
			}
			checkSubscription(t, b)
			c.remove(survivor)
			c.remove(early)
			c.stopPod(p)
			c.removePod(p)
			b.events.waitCount(3*len(want), eventTimeout)
			check(t, mode, b.final(), want)
		})
	}
}
