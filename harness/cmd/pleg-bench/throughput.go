package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Throughput's churn: pods of churnContainers containers, each living
// churnLifetime. A pod makes 3 transitions per container and 3 for its
// sandbox (Started, Died, Removed); those started in the churn's last
// churnLifetime make only their starts, so it is short.
const (
	churnContainers = 3
	churnLifetime   = 200 * time.Millisecond
	// maxLag is how long after the runtime's last transition the bridge
	// may take to have all of them acked for its throughput to count as
	// sustained.
	maxLag = time.Second
	// drainTimeout bounds the wait, after the churn, for every transition
	// to be acked.
	drainTimeout = 60 * time.Second
)

// throughputConfig is what measureThroughput measures.
type throughputConfig struct {
	rate     float64       // transitions per second
	duration time.Duration // of the churn
	reps     int
	// memoryOnly runs the bridge without a data directory (see nodeRun).
	memoryOnly bool
	// bridgeEnv is added to the bridge's environment (GOGC=50, ...).
	bridgeEnv []string
}

// measureThroughput measures, reps times, the bridge in evented mode as the
// DaemonSet runs it, in a process of its own, while the simulated runtime,
// in a process of its own, makes cfg.rate transitions a second for
// cfg.duration: the rate the runtime made them at, how long after the last
// the bridge had all of them acked (it kept up if that is short), what
// JetStream holds of them (nothing may be lost), and its
// CPU per transition beside the raw publisher's (see rawPublisher), which
// reads the same churn of a runtime of its own just before, in the same
// repetition (measureThroughputOnce says why not at the same time).
func measureThroughput(ctx context.Context, cfg throughputConfig, natsURL string, progress io.Writer) ([]measurement, error) {
	nc, err := nats.Connect(natsURL, nats.Name("pleg-bench"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// The stream the bridges make, made first: the raw publisher, which
	// runs first, makes none, and JetStream acks nothing without it.
	if err := bridge.EnsureStream(ctx, js, bridge.Options{Stream: bridge.StreamOptions{Manage: true}, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		return nil, err
	}
	var rates, lags, missing, bridgeCPU, rawCPU []float64
	for range cfg.reps {
		r, err := measureThroughputOnce(ctx, cfg, natsURL, js)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "throughput: %d transitions in %v, %d missing; bridge %v, raw %v cpu per transition (raw acked %d); "+
			"per transition: bridge %.2f read/write syscalls, %.2f context switches, %.1f KB allocated, %.0f B written to disk; raw %.2f, %.2f, %.1f KB\n",
			r.transitions, r.elapsed.Round(time.Millisecond), r.missing, r.bridge.cpu, r.raw.cpu, r.rawAcked,
			r.bridge.syscalls, r.bridge.switches, r.bridge.alloc/1e3, r.bridge.written, r.raw.syscalls, r.raw.switches, r.raw.alloc/1e3)
		rates = append(rates, float64(r.transitions)/cfg.duration.Seconds())
		lags = append(lags, float64(r.elapsed-cfg.duration)/float64(time.Millisecond))
		missing = append(missing, float64(r.missing))
		bridgeCPU = append(bridgeCPU, float64(r.bridge.cpu)/1e3)
		rawCPU = append(rawCPU, float64(r.raw.cpu)/1e3)
	}
	name := fmt.Sprintf("evented, asked %.0f/s for %v", cfg.rate, cfg.duration)
	minRate := minMadeRate(cfg.rate, cfg.duration)
	return []measurement{
		{name: "throughput: transitions made, " + name, unit: perSecond, values: rates,
			target: fmt.Sprintf("≥%.0f/s", minRate), met: func(m measurement) bool { return slices.Min(m.values) >= minRate }},
		{name: "throughput: last transition to all acked", unit: milliseconds, values: lags,
			target: fmt.Sprintf("≤%v", maxLag), met: maxAtMost(float64(maxLag / time.Millisecond))},
		{name: "transitions missing from the stream", unit: count, values: missing, target: "0", met: maxAtMost(0)},
		{name: "bridge cpu per transition", unit: microseconds, values: bridgeCPU,
			baseName: "stream decode + async publish", base: rawCPU, target: "≤1.5×", met: medianRatioAtMost(1.5)},
	}, nil
}

// minMadeRate is the least rate of transitions a runtime asked for rate
// over a churn of duration must make. A pod makes 3 transitions per
// container and 3 for its sandbox, but those still running when the churn
// ends, the ones started in its last 1.25 × churnLifetime at most, have
// made only their starts: 1 of the 3. What is left is rounded down to
// three significant digits: 10,053/s to 10,000/s.
func minMadeRate(rate float64, duration time.Duration) float64 {
	tail := 1.25 * float64(churnLifetime) / float64(duration)
	r := rate * (1 - 2.0/3*tail)
	if r <= 0 {
		return 0
	}
	unit := math.Pow(10, math.Floor(math.Log10(r))-2)
	return math.Floor(r/unit) * unit
}

type throughputResult struct {
	transitions int
	elapsed     time.Duration // the start of the churn to the ack of the last transition
	missing     int
	// What the bridge cost per transition, and the raw publisher per
	// message it had acked.
	bridge, raw churnCost
	rawAcked    int
}

// churnCost is what a reader of a churn cost per event.
type churnCost struct {
	cpu                time.Duration
	syscalls, switches float64 // read and write syscalls, context switches
	alloc              float64 // heap bytes allocated
	written            float64 // bytes written to storage
}

// costPer is what a reader whose stats were s0 and then s1 cost per event,
// over n events (at least 1).
func costPer(s0, s1 childStats, n int) churnCost {
	n = max(1, n)
	return churnCost{
		cpu:      (s1.CPU - s0.CPU) / time.Duration(n),
		syscalls: float64(s1.Syscalls-s0.Syscalls) / float64(n),
		switches: float64(s1.Switches-s0.Switches) / float64(n),
		alloc:    float64(s1.Allocated-s0.Allocated) / float64(n),
		written:  float64(s1.DiskWritten-s0.DiskWritten) / float64(n),
	}
}

func measureThroughputOnce(ctx context.Context, cfg throughputConfig, natsURL string, js jetstream.JetStream) (throughputResult, error) {
	// The raw publisher first, then the bridge, each beside a runtime of
	// its own making the same churn: each has the two cores to share with
	// the runtime and the NATS server only, as a node's bridge would.
	// Churned at the same time, from one runtime, the two readers and their
	// publishes had needed more than the two cores at 10,000 transitions/s
	// on the slower machine, and the one that fell a second behind was
	// dropped by the runtime.
	raw, acked, err := measureRawChurn(ctx, cfg, natsURL)
	if err != nil {
		return throughputResult{}, err
	}
	r, err := measureBridgeChurn(ctx, cfg, natsURL, js)
	r.raw, r.rawAcked = raw, acked
	return r, err
}

// startChurningRuntime starts, in dir, the simulated runtime that makes
// cfg's churn once its stats are first asked for.
func startChurningRuntime(ctx context.Context, cfg throughputConfig, dir string) (*child, error) {
	perPod := 3 * (churnContainers + 1)
	// The runtime drops a subscriber that falls a buffer's worth of events
	// behind. crisim's default of 4,096 is 0.3 s of events at 10,000
	// transitions/s, so a bridge would be dropped well within maxLag, the
	// lag this benchmark counts as keeping up: buffer maxLag's worth of
	// events at the asked rate instead. A pod emits a CREATED event for
	// its sandbox and for each container besides its transitions.
	eventsPerPod := perPod + churnContainers + 1
	eventBuffer := int(math.Ceil(cfg.rate / float64(perPod) * float64(eventsPerPod) * maxLag.Seconds()))
	return startChild(ctx, "churning runtime", childSpec{
		Role: roleRuntime, Socket: dir + "/cri.sock", Pods: 1, Containers: 1, EventBuffer: eventBuffer,
		ChurnPodsPerSecond: cfg.rate / float64(perPod), ChurnContainers: churnContainers,
		ChurnLifetime: churnLifetime, ChurnFor: cfg.duration,
	})
}

// churnRun is a runtime making cfg's churn, in a directory of its own, and
// the reader measured beside it, with the reader's stats from just before
// the churn began and the runtime's from its beginning.
type churnRun struct {
	dir             string
	rt, reader      *child
	reader0, before childStats
}

// startChurn starts a churning runtime in a new directory and, beside it,
// the reader start starts, and then the churn.
func startChurn(ctx context.Context, cfg throughputConfig, start func(dir string, rt *child) (*child, error)) (_ *churnRun, err error) {
	dir, err := os.MkdirTemp("", "pleg-bench-churn-")
	if err != nil {
		return nil, err
	}
	c := &churnRun{dir: dir}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	if c.rt, err = startChurningRuntime(ctx, cfg, dir); err != nil {
		return nil, err
	}
	if c.reader, err = start(dir, c.rt); err != nil {
		return nil, err
	}
	if c.reader0, err = c.reader.stats(ctx); err != nil {
		return nil, err
	}
	c.before, err = c.rt.stats(ctx) // starts the churn
	return c, err
}

// stop stops the reader and the runtime, and removes the directory.
func (c *churnRun) stop() error {
	err := stopAll(c.reader, c.rt)
	os.RemoveAll(c.dir)
	return err
}

// measureRawChurn runs cfg's churn with the raw publisher (see
// rawPublisher) reading it, and returns its cost per message it had acked
// and how many it had: should its stream end early (a subscriber that
// falls behind is dropped by the runtime), it is not flattered by
// transitions it never saw.
func measureRawChurn(ctx context.Context, cfg throughputConfig, natsURL string) (_ churnCost, acked int, err error) {
	c, err := startChurn(ctx, cfg, func(dir string, _ *child) (*child, error) {
		return startChild(ctx, "raw publisher", childSpec{Role: roleRaw, Socket: dir + "/cri.sock", NATSURL: natsURL})
	})
	if err != nil {
		return churnCost{}, 0, err
	}
	defer func() {
		if serr := c.stop(); err == nil {
			err = serr
		}
	}()
	rt, raw, r0, before := c.rt, c.reader, c.reader0, c.before
	// Until the churn is over and every message is acked, or a drain
	// timeout after.
	deadline := time.Now().Add(cfg.duration + drainTimeout)
	var r1 childStats
	for {
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return churnCost{}, 0, err
		}
		made, err := rt.stats(ctx)
		if err != nil {
			return churnCost{}, 0, err
		}
		if r1, err = raw.stats(ctx); err != nil {
			return churnCost{}, 0, err
		}
		if !made.Churning && r1.Events-r0.Events >= made.Events-before.Events || time.Now().After(deadline) {
			break
		}
	}
	acked = r1.Events - r0.Events
	return costPer(r0, r1, acked), acked, nil
}

// measureBridgeChurn runs cfg's churn with the evented bridge following
// it, and returns what it made of it (the raw publisher's fields unset).
func measureBridgeChurn(ctx context.Context, cfg throughputConfig, natsURL string, js jetstream.JetStream) (_ throughputResult, err error) {
	c, err := startChurn(ctx, cfg, func(dir string, rt *child) (*child, error) {
		node := &nodeRun{dir: dir, runtime: rt, socket: dir + "/cri.sock", natsURL: natsURL, memoryOnly: cfg.memoryOnly, bridgeEnv: cfg.bridgeEnv}
		return node.bridge(ctx, generator.ModeEvented, daemonSetMemLimit)
	})
	if err != nil {
		return throughputResult{}, err
	}
	defer func() {
		if serr := c.stop(); err == nil {
			err = serr
		}
	}()
	rt, bridge, b0, before := c.rt, c.reader, c.reader0, c.before
	start := time.Now()
	// Outside the measurement's CPU: the children's figures are their own.
	var made childStats
	deadline := start.Add(cfg.duration + drainTimeout)
	for {
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return throughputResult{}, err
		}
		if made, err = rt.stats(ctx); err != nil {
			return throughputResult{}, err
		}
		b, err := bridge.stats(ctx)
		if err != nil {
			return throughputResult{}, err
		}
		if !made.Churning && b.Pending == 0 {
			// Every transition made and everything received acked, or
			// the last ones still on their way: the stream says.
			stored, err := storedFor(ctx, js, bridge.node)
			if err != nil {
				return throughputResult{}, err
			}
			if stored >= made.Events-before.Events+2 { // and the populated pod's sandbox and container
				break
			}
		}
		if time.Now().After(deadline) {
			break
		}
	}
	elapsed := time.Since(start)
	b1, err := bridge.stats(ctx)
	if err != nil {
		return throughputResult{}, err
	}
	stored, err := storedFor(ctx, js, bridge.node)
	if err != nil {
		return throughputResult{}, err
	}
	n := made.Events - before.Events
	if n <= 0 {
		return throughputResult{}, errors.New("the runtime made no transition")
	}
	return throughputResult{
		transitions: n,
		elapsed:     elapsed,
		missing:     max(0, n+2-stored),
		bridge:      costPer(b0, b1, n),
	}, nil
}

// storedFor counts the messages the stream holds for node.
func storedFor(ctx context.Context, js jetstream.JetStream, node string) (int, error) {
	s, err := js.Stream(ctx, "PLEG")
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("pleg."+node+".>"))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n, nil
}
