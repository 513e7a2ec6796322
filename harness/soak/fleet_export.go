package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// This file exports, as thin wrappers, what the fleet harness (package
// fleet) shares with the soak: the churn driver, the accounting and the
// read-back of the stream. One copy of each serves both, so that a fleet's
// table means what a soak's does.

// Account compares the transitions made with the messages stored, window
// by window, as the soak's report does; see Accounting. windows must be in
// time order. It does no I/O.
func Account(windows []Window, made []Transition, stored []Stored, health []HealthFailure, blind []Window) Accounting {
	return account(windows, made, stored, health, blind)
}

// ReadStream reads every message of stream back with an ordered consumer
// and decodes it as the consumer package does; messages that do not decode
// are returned as descriptions. It blocks until it read up to the last
// sequence the stream held when it started.
func ReadStream(ctx context.Context, js jetstream.JetStream, stream string) ([]Stored, []string, error) {
	return readStream(ctx, js, stream)
}

// ConnectNATS connects a client to urls that reconnects forever, as the
// soak's own does: the servers go away during faults.
func ConnectNATS(urls []string) (*nats.Conn, jetstream.JetStream, error) {
	return connectNATS(urls)
}

// Settle waits until stream holds at least want messages, or timeout
// passed, and returns how many it holds.
func Settle(ctx context.Context, js jetstream.JetStream, stream string, want int, timeout time.Duration) (int, error) {
	return settle(ctx, js, stream, want, timeout)
}

// ChurnOptions configures a NodeChurn.
type ChurnOptions struct {
	// ContainersPerPod is the number of containers of each pod besides its
	// sandbox.
	ContainersPerPod int
	// Lifetime is how long a pod's containers run, give or take 50%.
	Lifetime time.Duration
	// Seed makes the pods, lifetimes and exits repeatable; nodes of one
	// fleet need seeds of their own, or their pods share UIDs.
	Seed uint64
}

// NodeChurn is the soak's churn driver for one node's runtime, stepped by
// its caller rather than by a ticker of its own: a fleet spreads one rate
// over many nodes from one goroutine. Each Step makes one runtime call,
// the next step of the pod most overdue or a new pod, and records the
// transitions it made. The pods the runtime ran before the churn stand
// until a rollout replaces them (Replace, Roll). It is not safe for
// concurrent use, except for Transitions and Count.
type NodeChurn struct {
	d   *driver
	c   churn
	rng *rand.Rand
	// standing are the pods that run until a rollout replaces them, oldest
	// first: those the runtime ran before the churn, then replacements.
	standing []*simPod
	// rolling are the runtime calls of the replacements planned and not
	// made yet, in order.
	rolling  []rollStep
	replaced int // pods whose replacement was planned, to name new ones
}

// rollStep is one runtime call of a rollout.
type rollStep struct {
	p    *simPod
	call func(d *driver, p *simPod, at time.Time) ([]Transition, error)
}

// NewNodeChurn returns a churn of rt's pods. It reads the pods rt runs
// already, which stand until replaced, and changes nothing yet.
func NewNodeChurn(rt *crisim.Runtime, opts ChurnOptions) *NodeChurn {
	d := newDriver(rt, driverOptions{ContainersPerPod: opts.ContainersPerPod, Lifetime: opts.Lifetime, Seed: opts.Seed})
	n := &NodeChurn{d: d, rng: rand.New(rand.NewPCG(opts.Seed, 0x50a4))}
	ready := &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}
	for _, sb := range rt.ListPodSandbox(ready) {
		p := &simPod{uid: sb.GetMetadata().GetUid(), sandboxID: sb.GetId(), ready: true}
		for _, c := range rt.ListContainers(&runtimeapi.ContainerFilter{PodSandboxId: sb.GetId()}) {
			state := created
			switch c.GetState() {
			case runtimeapi.ContainerState_CONTAINER_RUNNING:
				state = running
			case runtimeapi.ContainerState_CONTAINER_EXITED:
				state = exited
			}
			p.containers = append(p.containers, simContainer{id: c.GetId(), state: state})
		}
		n.standing = append(n.standing, p)
	}
	return n
}

// Step makes one runtime call and returns how many transitions it made. An
// error means the runtime refused the call: the driver's mirror of the
// model is wrong.
func (n *NodeChurn) Step() (int, error) {
	made, _, err := n.d.step(&n.c, n.rng)
	return made, err
}

// Replace plans the replacement of the node's k oldest standing pods (all
// of them if it has fewer), as a rolling deployment does it: for each, a
// new pod with a new UID starts (its sandbox, then each container), then
// the old pod ends by the kubelet's usual path (each container stopped,
// each removed, the sandbox stopped, then removed). The new pods stand
// until replaced in turn. It makes no runtime call: Roll makes them, one
// at a time, after those planned before. It returns the pods it will
// replace and the runtime calls that takes.
func (n *NodeChurn) Replace(k int) (pods, calls int) {
	k = min(k, len(n.standing))
	old := n.standing[:k:k]
	n.standing = n.standing[k:]
	before := len(n.rolling)
	for _, p := range old {
		n.planNew("rollout")
		n.planEnd(p)
	}
	return k, len(n.rolling) - before
}

// Evict plans the end of every standing pod of the node, as a drain of
// the node does it: each pod ends by the kubelet's usual path (each
// container stopped, each removed, the sandbox stopped, then removed);
// the pods stand nowhere after it, their replacements run elsewhere
// (Adopt). Like Replace it makes no runtime call, and returns the pods and
// the calls.
func (n *NodeChurn) Evict() (pods, calls int) {
	old := n.standing
	n.standing = nil
	before := len(n.rolling)
	for _, p := range old {
		n.planEnd(p)
	}
	return len(old), len(n.rolling) - before
}

// Adopt plans k new pods on the node, the replacements of pods evicted
// from another: each pod's sandbox, then each container, started; they
// stand until replaced. It returns the calls.
func (n *NodeChurn) Adopt(k int) (calls int) {
	before := len(n.rolling)
	for range k {
		n.planNew("rescheduled")
	}
	return len(n.rolling) - before
}

// planNew plans a new standing pod with a new UID, named after prefix: its
// sandbox, then each container, started.
func (n *NodeChurn) planNew(prefix string) {
	n.replaced++
	var uid [16]byte
	for i := range uid {
		uid[i] = byte(n.rng.Uint32())
	}
	q := &simPod{uid: formatUID(uid), containers: make([]simContainer, n.d.opts.ContainersPerPod)}
	n.plan(q, runSandbox(fmt.Sprintf("%s-%d", prefix, n.replaced)))
	for i := range q.containers {
		n.plan(q, startContainer(i))
	}
	n.standing = append(n.standing, q)
}

// planEnd plans p's end by the kubelet's usual path: each container
// stopped, each removed, the sandbox stopped, then removed.
func (n *NodeChurn) planEnd(p *simPod) {
	for i := range p.containers {
		n.plan(p, stopContainer(i, exit{code: 0, reason: "Completed"}))
	}
	for i := range p.containers {
		n.plan(p, removeContainer(i))
	}
	n.plan(p, stopSandbox)
	n.plan(p, removeSandbox)
}

func (n *NodeChurn) plan(p *simPod, call func(*driver, *simPod, time.Time) ([]Transition, error)) {
	n.rolling = append(n.rolling, rollStep{p: p, call: call})
}

// Roll makes the next runtime call that Replace planned and returns how
// many transitions it made; ok is false, and it makes no call, if none is
// left. An error means the runtime refused the call.
func (n *NodeChurn) Roll() (made int, ok bool, err error) {
	if len(n.rolling) == 0 {
		return 0, false, nil
	}
	s := n.rolling[0]
	n.rolling[0] = rollStep{}
	n.rolling = n.rolling[1:]
	ts, err := s.call(n.d, s.p, time.Now())
	if err != nil {
		return 0, false, err
	}
	n.d.record(ts...)
	return len(ts), true, nil
}

// runSandbox runs a new pod's sandbox, named name.
func runSandbox(name string) func(*driver, *simPod, time.Time) ([]Transition, error) {
	return func(d *driver, p *simPod, at time.Time) ([]Transition, error) {
		id, err := d.rt.RunPodSandbox(crisim.PodConfig{Name: name, Namespace: "soak", UID: p.uid})
		if err != nil {
			return nil, fmt.Errorf("rollout: run pod sandbox: %w", err)
		}
		p.sandboxID, p.ready = id, true
		return []Transition{p.transition(id, true, ContainerStarted, at)}, nil
	}
}

// Transitions returns a copy of the transitions made so far, in order. It
// is safe for concurrent use with Step.
func (n *NodeChurn) Transitions() []Transition { return n.d.transitions() }

// Count returns how many transitions were made so far. It is safe for
// concurrent use with Step.
func (n *NodeChurn) Count() int { return n.d.count() }
