package soak

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// driverTick is how often the driver catches up with its rate: at 200
// transitions a second, two or three per tick.
const driverTick = 10 * time.Millisecond

// maxCatchUp bounds how far behind its rate the driver may fall and still
// make up for it, so that a stalled process (a slow CI machine, a stop in a
// debugger) is not followed by a burst far above the rate.
const maxCatchUp = 100 * time.Millisecond

// driverOptions configures a driver.
type driverOptions struct {
	Rate             float64       // transitions per second
	ContainersPerPod int           // containers of each pod besides its sandbox
	Lifetime         time.Duration // how long containers run, give or take 50%
	Seed             uint64        // pod UIDs, lifetimes, exits and endings
}

// exit is one way a container ends, with its relative weight.
type exit struct {
	code   int32
	reason string
	weight int
}

// exits mixes clean exits, errors and kills the way a busy node sees them.
var exits = [...]exit{
	{0, "Completed", 5}, {1, "Error", 2}, {2, "Error", 1}, {137, "OOMKilled", 1}, {143, "Error", 1},
}

// driver makes pod churn in a crisim.Runtime at a steady rate of
// transitions and records each transition it makes, to be accounted for at
// the end. Pods live through every path that ends a container in CRI: a
// stop with an exit code then a remove, a remove of a running container (a
// kill: Died and Removed at once), a sandbox stop that kills its containers,
// and a sandbox remove that takes the whole pod at once.
//
// It mirrors the model's rules for what each call does to the objects it
// names (crisim's model.go), so the recorded transitions are exactly those
// the runtime made; it is the only caller that changes the runtime.
//
// pause, resume and transitions are safe for concurrent use with Run.
type driver struct {
	rt   *crisim.Runtime
	opts driverOptions

	// stepMu is held while a step calls the runtime, so that pause can wait
	// for the step in progress.
	stepMu sync.Mutex

	mu      sync.Mutex
	made    []Transition  // guarded by mu
	resumed chan struct{} // non-nil while paused, closed at resume; guarded by mu
}

func newDriver(rt *crisim.Runtime, opts driverOptions) *driver {
	return &driver{rt: rt, opts: opts}
}

// pause stops the churn: once it returns, the driver makes no transition
// until resume. It is how a runtime restart is modelled: containerd makes no
// CRI transition while it is down.
func (d *driver) pause() {
	d.stepMu.Lock() // wait for the step in progress; the next one sees the pause
	defer d.stepMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.resumed == nil {
		d.resumed = make(chan struct{})
	}
}

// resume restarts the churn at its rate, without catching up on the pause.
func (d *driver) resume() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.resumed != nil {
		close(d.resumed)
		d.resumed = nil
	}
}

// paused returns the channel closed at resume, nil if the driver runs.
func (d *driver) paused() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.resumed
}

// transitions returns a copy of the transitions made so far, in order.
func (d *driver) transitions() []Transition {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.made)
}

// count returns how many transitions were made so far.
func (d *driver) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.made)
}

func (d *driver) record(ts ...Transition) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.made = append(d.made, ts...)
}

// Run makes transitions at the driver's rate until ctx is done, then
// returns nil; pods alive at that moment stay as they are. It returns an
// error if the runtime refuses a call, which means the driver's mirror of
// the model is wrong. It starts no goroutine.
func (d *driver) Run(ctx context.Context) error {
	if d.opts.Rate <= 0 {
		return fmt.Errorf("churn: rate must be positive, got %v", d.opts.Rate)
	}
	rng := rand.New(rand.NewPCG(d.opts.Seed, 0x50a4))
	var c churn
	ticker := time.NewTicker(driverTick)
	defer ticker.Stop()
	base, done := time.Now(), 0 // transitions made since base
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if resume := d.paused(); resume != nil {
			select {
			case <-ctx.Done():
				return nil
			case <-resume:
			}
			base, done = time.Now(), 0
			continue
		}
		owed := int(time.Since(base).Seconds()*d.opts.Rate) - done
		if burst := int(maxCatchUp.Seconds() * d.opts.Rate); owed > burst {
			done += owed - burst
			owed = burst
		}
		for owed > 0 {
			n, ok, err := d.step(&c, rng)
			if err != nil {
				return err
			}
			if !ok { // paused meanwhile
				break
			}
			owed -= n
			done += n
		}
	}
}

// churn is the driver's view of the pods it runs; only Run's goroutine
// touches it.
type churn struct {
	pods    podQueue
	created int
}

// simPod is one pod of the churn and what is left of its life.
type simPod struct {
	uid        string
	sandboxID  string
	ready      bool // the sandbox is SANDBOX_READY
	containers []simContainer
	next       []plannedStep // the pod's remaining steps; the first is due at due
	due        time.Time
	index      int // in podQueue
}

// plannedStep is one runtime call of a pod's life, made after the previous
// step and a delay.
type plannedStep struct {
	after time.Duration
	call  func(d *driver, p *simPod, at time.Time) ([]Transition, error)
}

type simContainer struct {
	id    string
	state containerState
}

type containerState int

const (
	created containerState = iota
	running
	exited
	removed
)

// step makes one runtime call: the next step of the pod most overdue, or,
// if no pod has a step due, a new pod. It returns how many transitions the
// call made; ok is false if the driver is paused and made none.
func (d *driver) step(c *churn, rng *rand.Rand) (n int, ok bool, err error) {
	d.stepMu.Lock()
	defer d.stepMu.Unlock()
	if d.paused() != nil {
		return 0, false, nil
	}
	now := time.Now()
	if len(c.pods) > 0 && !c.pods[0].due.After(now) {
		p := c.pods[0]
		call := p.next[0].call
		p.next = p.next[1:]
		ts, err := call(d, p, now)
		if err != nil {
			return 0, false, err
		}
		if len(p.next) == 0 {
			heap.Pop(&c.pods)
		} else {
			p.due = now.Add(p.next[0].after)
			heap.Fix(&c.pods, p.index)
		}
		d.record(ts...)
		return len(ts), true, nil
	}
	p, ts, err := d.newPod(c, rng, now)
	if err != nil {
		return 0, false, err
	}
	heap.Push(&c.pods, p)
	d.record(ts...)
	return len(ts), true, nil
}

// newPod runs a new pod's sandbox and plans the rest of its life: start
// each container, run for about the lifetime, then end by one of four paths.
func (d *driver) newPod(c *churn, rng *rand.Rand, now time.Time) (*simPod, []Transition, error) {
	c.created++
	var uid [16]byte
	for i := range uid {
		uid[i] = byte(rng.Uint32())
	}
	p := &simPod{uid: formatUID(uid), ready: true}
	id, err := d.rt.RunPodSandbox(crisim.PodConfig{Name: fmt.Sprintf("soak-%d", c.created), Namespace: "soak", UID: p.uid})
	if err != nil {
		return nil, nil, fmt.Errorf("churn: run pod sandbox: %w", err)
	}
	p.sandboxID = id
	n := d.opts.ContainersPerPod
	now0 := func(call func(*driver, *simPod, time.Time) ([]Transition, error)) {
		p.next = append(p.next, plannedStep{call: call})
	}
	for i := range n {
		now0(startContainer(i))
	}
	// The pod's end comes after its lifetime; then its steps follow each
	// other as fast as the rate allows, as the kubelet tears a pod down.
	lifetime := time.Duration(float64(d.opts.Lifetime) * (0.5 + rng.Float64()))
	first := len(p.next)
	switch k := rng.IntN(20); {
	case k < 11: // the kubelet's usual path
		for i := range n {
			now0(stopContainer(i, pickExit(rng)))
		}
		for i := range n {
			now0(removeContainer(i))
		}
		now0(stopSandbox)
		now0(removeSandbox)
	case k < 14: // containers removed while running: each dies and goes at once
		for i := range n {
			now0(removeContainer(i))
		}
		now0(stopSandbox)
		now0(removeSandbox)
	case k < 17: // the sandbox stopped under running containers
		now0(stopSandbox)
		for i := range n {
			now0(removeContainer(i))
		}
		now0(removeSandbox)
	default: // the whole pod removed in one call
		now0(removeSandbox)
	}
	p.next[first].after = lifetime
	p.due = now.Add(p.next[0].after)
	p.containers = make([]simContainer, n)
	return p, []Transition{p.transition(p.sandboxID, true, ContainerStarted, now)}, nil
}

func (p *simPod) transition(id string, sandbox bool, typ string, at time.Time) Transition {
	return Transition{ContainerID: id, PodUID: p.uid, Sandbox: sandbox, Type: typ, At: at}
}

func startContainer(i int) func(*driver, *simPod, time.Time) ([]Transition, error) {
	return func(d *driver, p *simPod, at time.Time) ([]Transition, error) {
		name := "app"
		if i > 0 {
			name = fmt.Sprintf("sidecar-%d", i)
		}
		id, err := d.rt.CreateContainer(p.sandboxID, crisim.ContainerConfig{Name: name, Image: "registry.example/soak:1.0"})
		if err != nil {
			return nil, fmt.Errorf("churn: create container: %w", err)
		}
		p.containers[i].id = id
		if err := d.rt.StartContainer(id); err != nil {
			return nil, fmt.Errorf("churn: start container: %w", err)
		}
		p.containers[i].state = running
		return []Transition{p.transition(id, false, ContainerStarted, at)}, nil
	}
}

func stopContainer(i int, e exit) func(*driver, *simPod, time.Time) ([]Transition, error) {
	return func(d *driver, p *simPod, at time.Time) ([]Transition, error) {
		c := &p.containers[i]
		if err := d.rt.StopContainer(c.id, e.code, e.reason, ""); err != nil {
			return nil, fmt.Errorf("churn: stop container: %w", err)
		}
		if c.state != running {
			return nil, nil
		}
		c.state = exited
		return []Transition{p.transition(c.id, false, ContainerDied, at)}, nil
	}
}

// removeContainer removes a container; a running one is killed first, as
// CRI requires, so it dies and goes in the same call.
func removeContainer(i int) func(*driver, *simPod, time.Time) ([]Transition, error) {
	return func(d *driver, p *simPod, at time.Time) ([]Transition, error) {
		c := &p.containers[i]
		if err := d.rt.RemoveContainer(c.id); err != nil {
			return nil, fmt.Errorf("churn: remove container: %w", err)
		}
		var ts []Transition
		if c.state == running {
			ts = append(ts, p.transition(c.id, false, ContainerDied, at))
		}
		c.state = removed
		return append(ts, p.transition(c.id, false, ContainerRemoved, at)), nil
	}
}

// stopSandbox stops the sandbox, which kills its running containers.
func stopSandbox(d *driver, p *simPod, at time.Time) ([]Transition, error) {
	if err := d.rt.StopPodSandbox(p.sandboxID); err != nil {
		return nil, fmt.Errorf("churn: stop pod sandbox: %w", err)
	}
	return p.stopped(at), nil
}

// stopped records what a sandbox stop does: its running containers die,
// then the sandbox goes NOTREADY.
func (p *simPod) stopped(at time.Time) []Transition {
	if !p.ready {
		return nil
	}
	var ts []Transition
	for i := range p.containers {
		if c := &p.containers[i]; c.state == running {
			c.state = exited
			ts = append(ts, p.transition(c.id, false, ContainerDied, at))
		}
	}
	p.ready = false
	return append(ts, p.transition(p.sandboxID, true, ContainerDied, at))
}

// removeSandbox removes the pod: the sandbox is stopped if it is ready, its
// remaining containers are removed, then the sandbox itself.
func removeSandbox(d *driver, p *simPod, at time.Time) ([]Transition, error) {
	if err := d.rt.RemovePodSandbox(p.sandboxID); err != nil {
		return nil, fmt.Errorf("churn: remove pod sandbox: %w", err)
	}
	ts := p.stopped(at)
	for i := range p.containers {
		if c := &p.containers[i]; c.state != removed {
			c.state = removed
			ts = append(ts, p.transition(c.id, false, ContainerRemoved, at))
		}
	}
	return append(ts, p.transition(p.sandboxID, true, ContainerRemoved, at)), nil
}

func pickExit(rng *rand.Rand) exit {
	total := 0
	for _, e := range exits {
		total += e.weight
	}
	k := rng.IntN(total)
	for _, e := range exits {
		if k < e.weight {
			return e
		}
		k -= e.weight
	}
	return exits[0] // not reached: k < total
}

// formatUID formats b as a version 4 UUID, the form of Kubernetes UIDs.
func formatUID(b [16]byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// podQueue is a min-heap of pods by the time their next step is due.
type podQueue []*simPod

func (q podQueue) Len() int           { return len(q) }
func (q podQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q podQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *podQueue) Push(x any) {
	p := x.(*simPod)
	p.index = len(*q)
	*q = append(*q, p)
}
func (q *podQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return p
}
