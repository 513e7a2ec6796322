//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// envCost sets the node sizes TestRuntimeCost measures: comma-separated
// pod counts, e.g. "110,1000" (docs/performance.md's table), with
// windows of costWindow, each twice. Unset: 10 pods and short windows, a
// check that the measurement works rather than a measurement.
const envCost = "PLEG_E2E_COST"

const (
	// costWindow is one measurement window of the full run.
	costWindow = 10 * time.Second
	// costQuickWindow is one window of the default run.
	costQuickWindow = 3 * time.Second
	// costReps is how many times each window is measured.
	costReps = 2
	// churnRate is how many pods a second the churn creates (and, each a
	// little over a second later, removes), in every mode alike. On 2
	// cores with 110 pods, 5 a second was more than containerd kept up
	// with (3 a second went through, fewer beside a bridge): the modes
	// would not have had the same load.
	churnRate = 2
	// churnLife is how long a churn pod's container runs before it exits.
	churnLife = time.Second
	// clockTicks is USER_HZ, the unit of utime and stime in
	// /proc/<pid>/stat: 100 on every Linux architecture Go supports.
	clockTicks = 100
)

// procSample is one process's CPU time so far and its resident memory.
type procSample struct {
	cpu time.Duration // utime + stime
	rss int64         // VmRSS, bytes
}

// sampleProc reads pid's CPU time from /proc/<pid>/stat and its VmRSS
// from /proc/<pid>/status.
func sampleProc(t *testing.T, pid int) procSample {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("read the stat of process %d: %v", pid, err)
	}
	// The command name, in parentheses, may hold spaces: the fields are
	// counted after its closing parenthesis (field 3, state, is first).
	i := strings.LastIndexByte(string(stat), ')')
	fields := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(fields) < 13 {
		t.Fatalf("/proc/%d/stat: cannot parse %q", pid, stat)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(fields[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: utime %q, stime %q", pid, fields[11], fields[12])
	}
	s := procSample{cpu: time.Duration(utime+stime) * time.Second / clockTicks}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the status of process %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status: VmRSS %q", pid, v)
			}
			s.rss = kb << 10
		}
	}
	return s
}

// containerdPID is the pid containerd.sh recorded when it started the
// suite's containerd.
func containerdPID(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(suite.workdir, "containerd.pid"))
	if err != nil {
		t.Fatalf("containerd's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("containerd.pid: %q", data)
	}
	return pid
}

// usage is what one window measured: CPU as a fraction of one core over
// the window, RSS at its end; the bridge's are zero with no bridge.
type usage struct {
	ctrdCPU, bridgeCPU float64
	ctrdRSS, bridgeRSS int64
	churned            int // churn pods created and removed in the window
	skipped            int // churn ticks skipped: too many pods in flight
}

// churn creates churnRate pods a second, each with a container that exits
// after churnLife, and removes each pod (stops and removes the container,
// then the sandbox) 200 ms after its container should have exited, until stop is closed; then it waits for the pods
// in flight and returns how many went through. A tick finding 10 s worth
// of pods still in flight is skipped and counted, so that a slow runtime
// shows as fewer pods rather than as a pile-up.
func churn(c *cri, tag string, stop <-chan struct{}) (done, skipped int, err error) {
	var (
		wg       sync.WaitGroup
		n, fails atomic.Int64
		mu       sync.Mutex
		firstErr error // guarded by mu
	)
	sem := make(chan struct{}, 10*churnRate)
	tick := time.NewTicker(time.Second / churnRate)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			wg.Wait()
			if firstErr != nil {
				return int(n.Load()), skipped, fmt.Errorf("churn: %d pods failed, the first: %w", fails.Load(), firstErr)
			}
			return int(n.Load()), skipped, nil
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			skipped++
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			err := func() error {
				p, err := c.tryRunPod(fmt.Sprintf("churn-%s-%d", tag, i))
				if err != nil {
					return err
				}
				id, err := c.tryStartWork(p, "c", churnLife, 0)
				if err != nil {
					return err
				}
				// The container's own life, then a kubelet's stop.
				<-time.After(churnLife)
				// As a kubelet does: stop (a no-op for a container that
				// has exited, a kill for one still starting up on a
				// busy machine), then remove.
				ctx, cancel := c.ctx()
				defer cancel()
				if _, err := c.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}, waitForReady); err != nil {
					return fmt.Errorf("StopContainer %s in %s: %w", id, p.name, err)
				}
				// StopContainer may return before CRI's state says
				// exited, and RemoveContainer refuses a running one.
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for {
					resp, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id}, waitForReady)
					if err != nil {
						return fmt.Errorf("ContainerStatus %s in %s: %w", id, p.name, err)
					}
					if resp.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
						break
					}
					<-tick.C // the kubelet's way: it relists
				}
				return c.tryTeardown(p, id)
			}()
			if err != nil {
				fails.Add(1)
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			n.Add(1)
		})
	}
}

// measure runs one window of d, with churn if churning, and samples
// containerd and the bridge (pid 0: none) at its start and end.
func measure(t *testing.T, c *cri, ctrd, bridgePID int, d time.Duration, churning bool, tag string) usage {
	t.Helper()
	stop := make(chan struct{})
	var u usage
	var wg sync.WaitGroup
	var err error
	if churning {
		wg.Go(func() { u.churned, u.skipped, err = churn(c, tag, stop) })
	}
	c0, b0, t0 := sampleProc(t, ctrd), procSample{}, time.Now()
	if bridgePID != 0 {
		b0 = sampleProc(t, bridgePID)
	}
	<-time.After(d) // the measuring window itself
	c1, b1, t1 := sampleProc(t, ctrd), procSample{}, time.Now()
	if bridgePID != 0 {
		b1 = sampleProc(t, bridgePID)
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	el := t1.Sub(t0).Seconds()
	u.ctrdCPU, u.ctrdRSS = (c1.cpu-c0.cpu).Seconds()/el, c1.rss
	u.bridgeCPU, u.bridgeRSS = (b1.cpu-b0.cpu).Seconds()/el, b1.rss
	return u
}

// costRow is the windows of one version × pods × phase × mode.
type costRow struct {
	pods  int
	phase string // idle or churn
	mode  string // "none" without a bridge
	runs  []usage
}

// TestRuntimeCost measures what the bridge asks of containerd in normal
// work: containerd's CPU (utime+stime over the window, % of a core) and
// RSS (VmRSS at the window's end) on a node of N pods, each a sandbox and
// a running container, without a bridge and beside a bridge in each mode
// the version allows (modes()), idle and under churn (churnRate pods a
// second created and removed, containers exiting after churnLife), and
// the bridge's own CPU and RSS in the same windows. The bridge logs at
// Info, as in production; its NATS server runs in the test's process, so
// its cost is in neither column. It fails if a sample is empty (or a
// churning containerd used no CPU), if churn moved no pod, or if a mode held a feed it must not (checkSubscription:
// auto on 1.7 and containerd-events never open GetContainerEvents). With PLEG_E2E_COST it logs the
// markdown table of docs/performance.md.
func TestRuntimeCost(t *testing.T) {
	sizes, window := []int{10}, costQuickWindow
	if spec := os.Getenv(envCost); spec != "" {
		sizes, window = nil, costWindow
		for _, s := range strings.Split(spec, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: %q is not a number of pods", envCost, spec, s)
			}
			sizes = append(sizes, n)
		}
	}
	ctrd := containerdPID(t)
	var rows []*costRow
	for _, size := range sizes {
		rows = append(rows, measureSize(t, ctrd, size, window)...)
	}
	for _, r := range rows {
		for _, u := range r.runs {
			// An idle containerd may use less than one clock tick (10 ms)
			// in a short window; a churning one never does.
			if u.ctrdCPU < 0 || (r.phase == "churn" && u.ctrdCPU == 0) || u.ctrdRSS <= 0 {
				t.Errorf("%d pods, %s, %s: containerd CPU %.4f, RSS %d: no sample", r.pods, r.phase, r.mode, u.ctrdCPU, u.ctrdRSS)
			}
			if r.mode != "none" && u.bridgeRSS <= 0 {
				t.Errorf("%d pods, %s, %s: bridge RSS %d: no sample", r.pods, r.phase, r.mode, u.bridgeRSS)
			}
			if r.phase == "churn" && u.churned == 0 {
				t.Errorf("%d pods, %s: churn moved no pod", r.pods, r.mode)
			}
		}
	}
	t.Logf("runtime cost table (window %v, %d windows each):\n%s", window, costReps, costTable(rows))
}

// measureSize starts size pods, each with a container that runs for the
// whole test, then measures every mode on them, idle and under churn.
func measureSize(t *testing.T, ctrd, size int, window time.Duration) []*costRow {
	t.Helper()
	c := newCRI(t)
	start := time.Now()
	pods := make([]pod, size)
	ids := make([]string, size)
	errs := make([]error, size)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range size {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if pods[i], errs[i] = c.tryRunPod(fmt.Sprintf("idle-%d", i)); errs[i] == nil {
				ids[i], errs[i] = c.tryStartWork(pods[i], "c", 24*time.Hour, 0)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("containerd %s: %d pods started in %v", suite.version, size, time.Since(start).Round(time.Second))
	// A window for containerd to settle after the start-up burst.
	<-time.After(window)

	var rows []*costRow
	for _, mode := range append([]string{"none"}, modes()...) {
		idle := &costRow{pods: size, phase: "idle", mode: mode}
		busy := &costRow{pods: size, phase: "churn", mode: mode}
		var b *bridge
		pid := 0
		if mode != "none" {
			b = startBridge(t, mode, c.prefix, "PLEG_LOG_LEVEL=info")
			pid = b.cmd.Process.Pid
			// A window for the first relist of the node to settle; the
			// bridge is up (startBridge waited for its stream).
			<-time.After(window)
		}
		for rep := range costReps {
			idle.runs = append(idle.runs, measure(t, c, ctrd, pid, window, false, ""))
			busy.runs = append(busy.runs, measure(t, c, ctrd, pid, window, true, fmt.Sprintf("%s-%d", mode, rep)))
			// measure waited for the churn's last removals; two seconds of
			// quiet before the next idle window, a settling window.
			<-time.After(2 * time.Second)
		}
		if b != nil {
			checkSubscription(t, b)
			b.stop()
		}
		rows = append(rows, idle, busy)
	}
	start = time.Now()
	for i, p := range pods {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = c.tryTeardown(p, ids[i])
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("containerd %s: %d pods removed in %v", suite.version, size, time.Since(start).Round(time.Second))
	return rows
}

// costTable formats rows as markdown, each figure the range over the
// windows, containerd's RSS also as a ratio to the row without a bridge.
func costTable(rows []*costRow) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| containerd | pods | load | bridge mode | containerd CPU (%% of a core) | containerd RSS (MiB) | RSS vs no bridge | bridge CPU (%% of a core) | bridge RSS (MiB) | churn pods/window |\n")
	fmt.Fprintf(&sb, "|---|---|---|---|---|---|---|---|---|---|\n")
	base := map[string]float64{}
	for _, r := range rows {
		rss := mean(r.runs, func(u usage) float64 { return float64(u.ctrdRSS) })
		key := fmt.Sprint(r.pods, r.phase)
		if r.mode == "none" {
			base[key] = rss
		}
		ratio := "–"
		if b := base[key]; b > 0 {
			ratio = fmt.Sprintf("%.2f", rss/b)
		}
		bcpu, brss := "–", "–"
		if r.mode != "none" {
			bcpu = span(r.runs, "%.1f", func(u usage) float64 { return 100 * u.bridgeCPU })
			brss = span(r.runs, "%.0f", func(u usage) float64 { return float64(u.bridgeRSS) / (1 << 20) })
		}
		churned := "–"
		if r.phase == "churn" {
			churned = span(r.runs, "%.0f", func(u usage) float64 { return float64(u.churned) })
			if s := span(r.runs, "%.0f", func(u usage) float64 { return float64(u.skipped) }); s != "0" {
				churned += " (" + s + " ticks skipped)"
			}
		}
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", suite.version, r.pods, r.phase, r.mode,
			span(r.runs, "%.1f", func(u usage) float64 { return 100 * u.ctrdCPU }),
			span(r.runs, "%.0f", func(u usage) float64 { return float64(u.ctrdRSS) / (1 << 20) }),
			ratio, bcpu, brss, churned)
	}
	return sb.String()
}

// span formats the range of f over runs, "lo–hi", or one figure if they agree.
func span(runs []usage, format string, f func(usage) float64) string {
	vs := make([]float64, len(runs))
	for i, u := range runs {
		vs[i] = f(u)
	}
	lo, hi := fmt.Sprintf(format, slices.Min(vs)), fmt.Sprintf(format, slices.Max(vs))
	if lo == hi {
		return lo
	}
	return lo + "–" + hi
}

func mean(runs []usage, f func(usage) float64) float64 {
	var sum float64
	for _, u := range runs {
		sum += f(u)
	}
	return sum / float64(len(runs))
}
