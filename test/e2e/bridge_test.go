//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// streamName is the bridge's default JetStream stream.
const streamName = "PLEG"

// bridge is a pleg-bridge subprocess with its own NATS server, and the
// events of the test's pods as they reach the stream.
type bridge struct {
	t       *testing.T
	mode    string
	metrics string // http://host:port/metrics
	logPath string
	cmd     *exec.Cmd
	exited  chan error // receives cmd.Wait's result once
	js      jetstream.JetStream
	events  *collector
}

// startBridge runs the pleg-bridge binary in mode against the suite's
// containerd and a fresh in-process NATS server, configured only by PLEG_*
// variables (env adds to them), and follows the events of pods whose UID
// starts with prefix. The bridge is stopped at cleanup if the test did not
// stop it.
func startBridge(t *testing.T, mode, prefix string, env ...string) *bridge {
	t.Helper()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	dir := t.TempDir()
	b := &bridge{t: t, mode: mode, logPath: filepath.Join(dir, "bridge.log"), exited: make(chan error, 1), js: js}
	addr := freeAddress(t)
	b.metrics = "http://" + addr + "/metrics"
	logFile, err := os.Create(b.logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	b.cmd = exec.Command(suite.bridge, "run")
	b.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"PLEG_NODE_NAME=e2e-node",
		"PLEG_CRI_ENDPOINT=unix://" + suite.socket,
		"PLEG_NATS_URL=" + url,
		"PLEG_MODE=" + mode,
		"PLEG_RELIST_PERIOD=1s",
		"PLEG_DATA_DIR=" + filepath.Join(dir, "data"),
		"PLEG_LISTEN_ADDRESS=" + addr,
		"PLEG_LOG_FORMAT=json",
		"PLEG_LOG_LEVEL=debug",
	}
	b.cmd.Env = append(b.cmd.Env, env...)
	b.cmd.Stdout, b.cmd.Stderr = logFile, logFile
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("start pleg-bridge: %v", err)
	}
	go func() { b.exited <- b.cmd.Wait() }()
	t.Cleanup(func() {
		if b.cmd.ProcessState == nil {
			b.cmd.Process.Kill()
			<-b.exited
		}
		if t.Failed() {
			b.dumpLog()
		}
	})
	publishtest.WaitStream(t, js, streamName)
	b.events = follow(t, js, prefix)
	return b
}

// freeAddress returns a loopback address with a port free at the time of
// the call. The bridge logs its configured address, not the bound one, so
// "127.0.0.1:0" would leave the tests unable to find /metrics.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// stop sends SIGTERM and waits for the bridge to exit, which it must do
// with status 0 after flushing what it has to publish.
func (b *bridge) stop() {
	b.t.Helper()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.t.Fatalf("signal pleg-bridge: %v", err)
	}
	select {
	case err := <-b.exited:
		if err != nil {
			b.t.Errorf("pleg-bridge exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		b.t.Fatal("pleg-bridge did not exit within 30s of SIGTERM")
	}
}

func (b *bridge) dumpLog() {
	data, err := os.ReadFile(b.logPath)
	if err != nil {
		b.t.Logf("bridge log: %v", err)
		return
	}
	const max = 64 << 10
	if len(data) > max {
		data = append([]byte("…\n"), data[len(data)-max:]...)
	}
	b.t.Logf("bridge log (%s mode):\n%s", b.mode, data)
}

// scrape returns the value of every sample of the bridge's /metrics whose
// name and labels start with prefix, keyed by the sample's series.
func (b *bridge) scrape(prefix string) map[string]string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.metrics, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatalf("scrape %s: %v", b.metrics, err)
	}
	defer resp.Body.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) {
			i := strings.LastIndexByte(line, ' ')
			out[line[:i]] = line[i+1:]
		}
	}
	if err := sc.Err(); err != nil {
		b.t.Fatalf("read %s: %v", b.metrics, err)
	}
	return out
}

// event is a decoded event with the time JetStream stored it.
type event struct {
	consumer.Event
	stored time.Time
}

func (e event) String() string {
	s := e.LifecycleType() + " " + e.Subject
	if e.Data.ExitCode != nil {
		s += fmt.Sprintf(" exit=%d", *e.Data.ExitCode)
	}
	if e.Data.Reason != "" {
		s += " reason=" + e.Data.Reason
	}
	return s + " by=" + e.Data.DetectedBy
}

// collector reads the whole stream in order and keeps the events of the
// test's pods. It is safe for concurrent use.
type collector struct {
	t       *testing.T
	prefix  string
	mu      sync.Mutex
	events  []event       // guarded by mu
	seen    uint64        // guarded by mu: stream sequence of the last message read
	err     error         // guarded by mu: the first message that did not decode
	changed chan struct{} // capacity 1: signalled on every new event
}

func follow(t *testing.T, js jetstream.JetStream, prefix string) *collector {
	t.Helper()
	c := &collector{t: t, prefix: prefix, changed: make(chan struct{}, 1)}
	cons, err := js.OrderedConsumer(t.Context(), streamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(c.add)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return c
}

func (c *collector) add(msg jetstream.Msg) {
	e, err := consumer.DecodeMsg(msg)
	var stored time.Time
	if err == nil {
		var meta *jetstream.MsgMetadata
		if meta, err = msg.Metadata(); err == nil {
			stored = meta.Timestamp
		}
	}
	c.mu.Lock()
	if meta, merr := msg.Metadata(); merr == nil {
		c.seen = meta.Sequence.Stream
	}
	switch {
	case err != nil:
		if c.err == nil {
			c.err = fmt.Errorf("message %s on %s: %w", msg.Headers().Get("Nats-Msg-Id"), msg.Subject(), err)
		}
	case strings.HasPrefix(e.PodUID, c.prefix):
		c.events = append(c.events, event{Event: e, stored: stored})
	}
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *collector) snapshot() ([]event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]event(nil), c.events...), c.err
}

// waitFor blocks until done holds for the events so far, or fails the test
// after d, naming what it waited for.
func (c *collector) waitFor(what string, d time.Duration, done func([]event) bool) []event {
	c.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		evs, err := c.snapshot()
		if err != nil {
			c.t.Fatal(err)
		}
		if done(evs) {
			return evs
		}
		select {
		case <-c.changed:
		case <-deadline.C:
			c.t.Fatalf("after %v, still waiting for %s; events so far:\n%s", d, what, list(evs))
		}
	}
}

// waitEvent waits for the event of type typ of container id.
func (c *collector) waitEvent(typ, id string, d time.Duration) event {
	c.t.Helper()
	var found event
	c.waitFor(typ+" of "+id, d, func(evs []event) bool {
		for _, e := range evs {
			if e.ContainerID == id && e.LifecycleType() == typ {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// waitCount waits until n events of the test's pods are in the stream.
func (c *collector) waitCount(n int, d time.Duration) []event {
	c.t.Helper()
	return c.waitFor(fmt.Sprintf("%d events", n), d, func(evs []event) bool { return len(evs) >= n })
}

// final checks that CRI agreed with every exit the bridge reported from
// containerd's task exits (pleg_bridge_task_event_mismatches_total is 0
// for every field), stops the bridge, so that nothing more can arrive, and
// returns the test's events once the stream's last message has been read.
func (b *bridge) final() []event {
	b.t.Helper()
	mismatches := 0
	for series, v := range b.scrape("pleg_bridge_task_event_mismatches_total") {
		mismatches++
		if v != "0" {
			b.t.Errorf("%s mode: %s = %s: CRI reported an exit otherwise than containerd's task exit", b.mode, series, v)
		}
	}
	if mismatches == 0 {
		b.t.Errorf("%s mode: no pleg_bridge_task_event_mismatches_total series on /metrics", b.mode)
	}
	b.stop()
	info, err := b.js.Stream(b.t.Context(), streamName)
	if err != nil {
		b.t.Fatal(err)
	}
	last := info.CachedInfo().State.LastSeq
	evs := b.events.waitFor(fmt.Sprintf("the stream up to sequence %d", last), 20*time.Second, func([]event) bool {
		return b.events.lastSeq() >= last
	})
	b.logWarnings()
	return evs
}

// logWarnings logs the bridge's Warn and Error records, which are not
// failures by themselves (a runtime restart is expected to cause some).
func (b *bridge) logWarnings() {
	data, err := os.ReadFile(b.logPath)
	if err != nil {
		b.t.Logf("bridge log: %v", err)
		return
	}
	var warn []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			warn = append(warn, line)
		}
	}
	if len(warn) > 20 {
		warn = append(warn[:20], fmt.Sprintf("… %d more", len(warn)-20))
	}
	if len(warn) > 0 {
		b.t.Logf("%s mode: the bridge logged %d warnings and errors:\n%s", b.mode, len(warn), strings.Join(warn, "\n"))
	}
}

func (c *collector) lastSeq() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen
}

func list(evs []event) string {
	var sb strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&sb, "  #%d %s %s\n", e.Sequence, e.ContainerID[:min(12, len(e.ContainerID))], e)
	}
	return sb.String()
}

// name says which bridge b is, in a test that runs two.
func (b *bridge) name() string {
	for _, e := range b.cmd.Env {
		if e == "PLEG_EXITS_FROM_CRI=true" {
			return b.mode + " mode, exits from CRI"
		}
	}
	return b.mode + " mode"
}
