//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// goroutineDump makes containerd dump its goroutines (SIGUSR1) and returns
// the dump: containerd writes it to a file it names in its log, or into the
// log itself.
func goroutineDump(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(suite.workdir, "containerd.pid"))
	if err != nil {
		t.Fatalf("containerd's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("containerd's pid %q: %v", raw, err)
	}
	logPath := filepath.Join(suite.workdir, "containerd.log")
	before, _ := os.ReadFile(logPath)
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatalf("signal containerd: %v", err)
	}
	written := regexp.MustCompile(`goroutine stack dump written to ([^ "\\]+)`)
	var dump string
	waittest.Until(t, 30*time.Second, "containerd's goroutine dump after SIGUSR1", func() (bool, error) {
		now, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		added := now[min(len(before), len(now)):]
		if m := written.FindSubmatch(added); m != nil {
			b, err := os.ReadFile(string(m[1]))
			if err != nil {
				t.Fatalf("read containerd's goroutine dump: %v", err)
			}
			os.Remove(string(m[1]))
			dump = string(b)
			return true, nil
		}
		if i := bytes.Index(added, []byte("=== END goroutine stack dump ===")); i >= 0 {
			dump = string(added[:i])
			return true, nil
		}
		return false, fmt.Errorf("containerd's log grew by:\n%s", added)
	})
	return dump
}

// TestTheBridgeStealsNoCRIEvent runs, on containerd 1.7 (one shared CRI
// event channel), the bridge in auto mode beside a CRI GetContainerEvents
// subscriber that stands for the kubelet: containerd's goroutine dump shows
// the bridge subscribed to containerd's event service and to no CRI event
// stream, and the subscriber receives every CRI event of a pod's life while
// the bridge reports every transition.
func TestTheBridgeStealsNoCRIEvent(t *testing.T) {
	if !strings.HasPrefix(suite.version, "1.") {
		t.Skipf("containerd %s fans CRI events out to every subscriber; stealing is a 1.7 concern", suite.version)
	}
	c := newCRI(t)
	b := startBridge(t, "auto", c.prefix)
	// A first pod: once its start is reported, the bridge is subscribed.
	warm := c.runPod("warm")
	b.events.waitEvent("ContainerStarted", warm.id, eventTimeout)

	dump := goroutineDump(t)
	cri := strings.Count(dump, "GetContainerEvents")
	subscribe := regexp.MustCompile(`services/events\.\(\*service\)\.Subscribe`).FindAllStringIndex(dump, -1)
	t.Logf("containerd's goroutine dump: %d frames in GetContainerEvents, %d goroutines in the event service's Subscribe", cri, len(subscribe))
	if cri != 0 {
		t.Errorf("containerd 1.7 serves %d GetContainerEvents frames with only the bridge connected, want none", cri)
	}
	if len(subscribe) != 1 {
		t.Errorf("%d goroutines in containerd's events Subscribe, want 1 (the bridge)", len(subscribe))
	}

	// The kubelet's stand-in subscribes and waits for the headers.
	kubelet := followCRIEvents(t, c)
	p := c.runPod("watched")
	id := c.startWork(p, "app", 500*time.Millisecond, 4)
	b.events.waitEvent("ContainerDied", id, eventTimeout)
	st := c.exitedStatus(id)
	c.remove(id)
	c.stopPod(p)
	c.removePod(p)
	c.stopPod(warm)
	c.removePod(warm)
	want := map[string]expected{
		warm.id: {subject: podNamespace + "/warm", sandbox: true},
		p.id:    {subject: podNamespace + "/watched", sandbox: true},
		id:      {subject: podNamespace + "/watched/app", status: st, exit: 4},
	}
	b.events.waitCount(3*len(want), eventTimeout)
	checkSubscription(t, b)
	check(t, "auto", b.final(), want)

	wantCRI := []string{
		"CONTAINER_CREATED_EVENT sandbox", "CONTAINER_STARTED_EVENT sandbox",
		"CONTAINER_CREATED_EVENT app", "CONTAINER_STARTED_EVENT app", "CONTAINER_STOPPED_EVENT app", "CONTAINER_DELETED_EVENT app",
		"CONTAINER_STOPPED_EVENT sandbox", "CONTAINER_DELETED_EVENT sandbox",
	}
	got := kubelet.waitFor(len(wantCRI), eventTimeout, func(ev *runtimeapi.ContainerEventResponse) (string, bool) {
		switch ev.GetContainerId() {
		case p.id:
			return ev.GetContainerEventType().String() + " sandbox", true
		case id:
			return ev.GetContainerEventType().String() + " app", true
		}
		return "", false
	})
	if fmt.Sprint(got) != fmt.Sprint(wantCRI) {
		t.Errorf("the CRI subscriber beside the bridge received\n  %v\nwant every event of the pod's life:\n  %v", got, wantCRI)
	}
}

// criEvents is a GetContainerEvents subscriber: what it received so far.
type criEvents struct {
	t       *testing.T
	arrived chan *runtimeapi.ContainerEventResponse
}

// followCRIEvents opens a GetContainerEvents stream on the test's CRI
// connection, as the kubelet does, until the test ends. containerd 1.7
// buffers the events of its shared channel until someone receives them, so
// nothing emitted after this call is missed by a subscriber that reads
// later.
func followCRIEvents(t *testing.T, c *cri) *criEvents {
	t.Helper()
	stream, err := c.rt.GetContainerEvents(t.Context(), &runtimeapi.GetEventsRequest{}, waitForReady)
	if err != nil {
		t.Fatalf("GetContainerEvents: %v", err)
	}
	e := &criEvents{t: t, arrived: make(chan *runtimeapi.ContainerEventResponse, 4096)}
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				close(e.arrived)
				return
			}
			e.arrived <- ev
		}
	}()
	return e
}

// waitFor returns the first n events that classify names, in arrival
// order, or fails the test after d.
func (e *criEvents) waitFor(n int, d time.Duration, classify func(*runtimeapi.ContainerEventResponse) (string, bool)) []string {
	e.t.Helper()
	var got []string
	deadline := time.After(d)
	for len(got) < n {
		select {
		case ev, ok := <-e.arrived:
			if !ok {
				e.t.Fatalf("the CRI event stream ended after %v", got)
			}
			if name, ok := classify(ev); ok {
				got = append(got, name)
			}
		case <-deadline:
			e.t.Errorf("the CRI subscriber received only %v within %v", got, d)
			return got
		}
	}
	return got
}
