package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// Bounds of waiting for the bridge process.
const (
	// readyTimeout bounds the wait for a started bridge to answer /readyz
	// with 200: it connects to NATS, sets up the stream (three replicas in
	// a cluster) and makes its first relist.
	readyTimeout = time.Minute
	// readyPoll is how often /readyz is asked meanwhile.
	readyPoll = 50 * time.Millisecond
	// stopTimeout bounds a graceful stop: the bridge's own drain deadline
	// (PLEG_SHUTDOWN_TIMEOUT, 10s by default) and some.
	stopTimeout = 30 * time.Second
)

// bridgeProcess runs the bridge as a child process, "pleg-bridge run"
// configured by PLEG_* variables, so that a kill is a real SIGKILL: no
// deferred function, no last checkpoint write, no drain. Its log goes to a
// file that each incarnation appends to.
//
// Its methods are called from the schedule's goroutine; done and the
// health probes' URL are safe for concurrent use.
type bridgeProcess struct {
	proc    *proc.Process
	baseURL string // http://host:port of /healthz, /readyz and /metrics
	client  *http.Client
}

func newBridgeProcess(binary string, env []string, logPath, listenAddr string) *bridgeProcess {
	return &bridgeProcess{
		proc:    proc.New("bridge", []string{binary, "run"}, proc.Options{Env: env, LogPath: logPath, StopTimeout: stopTimeout}),
		baseURL: "http://" + listenAddr,
		// Generous: on a CI machine's two busy cores a slow answer is not
		// the failure /healthz reports.
		client: &http.Client{Timeout: 5 * time.Second},
	}
}

// logPath is the file the bridge's output goes to.
func (b *bridgeProcess) logPath() string { return b.proc.LogPath() }

// start starts a bridge process and waits until it is ready. The process
// runs until kill or stop; start never leaves one behind on error.
func (b *bridgeProcess) start(ctx context.Context) error {
	return b.startUntil(ctx, "/readyz")
}

// startUntil starts a bridge process and waits until path answers 200:
// /readyz, or /healthz while NATS is away and the bridge cannot be ready.
func (b *bridgeProcess) startUntil(ctx context.Context, path string) error {
	if err := b.proc.Start(); err != nil {
		return err
	}
	if err := b.waitOK(ctx, path, readyTimeout); err != nil {
		b.kill()
		return err
	}
	return nil
}

// waitReady polls /readyz until it answers 200, the process exits, or
// timeout passes.
func (b *bridgeProcess) waitReady(ctx context.Context, timeout time.Duration) error {
	return b.waitOK(ctx, "/readyz", timeout)
}

// waitOK polls path until it answers 200, the process exits, or timeout
// passes. Polling is the way here: the bridge offers nothing else.
func (b *bridgeProcess) waitOK(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(readyPoll)
	defer ticker.Stop()
	last := "no answer yet"
	for {
		status, body, err := b.get(ctx, path)
		switch {
		case err == nil && status == http.StatusOK:
			return nil
		case err == nil:
			last = fmt.Sprintf("%d %s", status, body)
		default:
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("wait for the bridge's %s: not 200 after %v: %s (log: %s)", path, timeout, last, b.logPath())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.done():
			if err := b.exitError(); err != nil {
				return err
			}
			return errors.New("wait for the bridge to be ready: it was stopped")
		case <-ticker.C:
		}
	}
}

// waitNotReady polls /readyz until it answers 503, and returns the answer's
// body (the reason). It returns an error if it still answers otherwise at
// deadline, or if ctx ends or the process exits first.
func (b *bridgeProcess) waitNotReady(ctx context.Context, deadline time.Time) (string, error) {
	ticker := time.NewTicker(readyPoll)
	defer ticker.Stop()
	last := "no answer yet"
	for {
		status, body, err := b.get(ctx, "/readyz")
		switch {
		case err == nil && status == http.StatusServiceUnavailable:
			return body, nil
		case err == nil:
			last = fmt.Sprintf("%d %s", status, body)
		default:
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("still %s at the end (log: %s)", last, b.logPath())
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-b.done():
			return "", errors.New("the bridge exited")
		case <-ticker.C:
		}
	}
}

// get asks the bridge's HTTP endpoint for path.
func (b *bridgeProcess) get(ctx context.Context, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.baseURL+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// done returns a channel closed when the current process has exited; nil
// (never ready) before the first start.
func (b *bridgeProcess) done() <-chan struct{} { return b.proc.Done() }

// crashed returns a channel closed when the current process exits on its
// own; nil (never ready) while no process runs or once the soak ended it.
func (b *bridgeProcess) crashed() <-chan struct{} { return b.proc.Crashed() }

// exitError describes how the current process ended, once done is closed;
// nil if the soak ended it.
func (b *bridgeProcess) exitError() error { return b.proc.ExitError() }

// kill ends the current process with SIGKILL and waits until it is gone.
func (b *bridgeProcess) kill() { b.proc.Kill() }

// stop ends the current process with SIGTERM, as Kubernetes stops a pod,
// and waits for it to drain and exit, for stopTimeout at most (then it
// kills it). It returns an error if the bridge did not exit cleanly.
func (b *bridgeProcess) stop() error { return b.proc.Stop(proc.Term) }

// counter scrapes /metrics and returns the sum of the samples of a counter
// (all its label sets), 0 if the bridge exposes none yet.
func (b *bridgeProcess) counter(ctx context.Context, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.baseURL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape bridge metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape bridge metrics: %s", resp.Status)
	}
	return sumSamples(resp.Body, name)
}

// sumSamples sums the samples of metric name in Prometheus' text format.
func sumSamples(r io.Reader, name string) (float64, error) {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a comment, another metric, or one whose name only starts so
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, fmt.Errorf("parse metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parse metrics: %q: %w", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read metrics: %w", err)
	}
	return sum, nil
}
