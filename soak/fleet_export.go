package soak

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
// transitions it made. It is not safe for concurrent use, except for
// Transitions and Count.
type NodeChurn struct {
	d   *driver
	c   churn
	rng *rand.Rand
}

// NewNodeChurn returns a churn of rt's pods. It makes no call yet.
func NewNodeChurn(rt *crisim.Runtime, opts ChurnOptions) *NodeChurn {
	d := newDriver(rt, driverOptions{ContainersPerPod: opts.ContainersPerPod, Lifetime: opts.Lifetime, Seed: opts.Seed})
	return &NodeChurn{d: d, rng: rand.New(rand.NewPCG(opts.Seed, 0x50a4))}
}

// Step makes one runtime call and returns how many transitions it made. An
// error means the runtime refused the call: the driver's mirror of the
// model is wrong.
func (n *NodeChurn) Step() (int, error) {
	made, _, err := n.d.step(&n.c, n.rng)
	return made, err
}

// Transitions returns a copy of the transitions made so far, in order. It
// is safe for concurrent use with Step.
func (n *NodeChurn) Transitions() []Transition { return n.d.transitions() }

// Count returns how many transitions were made so far. It is safe for
// concurrent use with Step.
func (n *NodeChurn) Count() int { return n.d.count() }
