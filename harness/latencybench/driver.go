package latencybench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// paced is what pace measured of the calls made after the warmup.
type paced struct {
	rate float64 // calls per second achieved
	cpu  float64 // the process's CPU use, in cores; 0 where unknown
	// runtimeCPU is the runtime's process's CPU use, in cores, when the
	// calls were made there (RuntimeProcess); 0 otherwise or where unknown.
	runtimeCPU float64
}

// pace calls op at rate per second for warmup+duration, paced by a ticker:
// at each tick it makes the calls that are due by then, so a late tick is
// caught up at once and the rate holds on average (an open-loop load, as a
// node's pods do not wait for the bridge). op learns whether the call is
// measured (after the warmup). pace returns the achieved rate and the
// process's CPU use while measuring, or the first error of op or ctx.
func pace(ctx context.Context, rate float64, warmup, duration time.Duration, op func(measured bool) error) (paced, error) {
	interval := max(time.Millisecond, time.Duration(float64(time.Second)/rate))
	t := time.NewTicker(interval)
	defer t.Stop()
	warm := int(math.Round(rate * warmup.Seconds()))
	total := warm + int(math.Round(rate*duration.Seconds()))
	start := time.Now()
	var measuring time.Time
	var cpu0 time.Duration
	for done := 0; ; {
		due := min(total, 1+int(rate*time.Since(start).Seconds()))
		for ; done < due; done++ {
			if done == warm {
				measuring, cpu0 = time.Now(), processCPU()
			}
			if err := op(done >= warm); err != nil {
				return paced{}, err
			}
		}
		if done == total {
			if total == warm {
				return paced{}, nil
			}
			elapsed := time.Since(measuring)
			p := paced{rate: float64(total-warm) / elapsed.Seconds()}
			if cpu0 > 0 {
				p.cpu = (processCPU() - cpu0).Seconds() / elapsed.Seconds()
			}
			return p, nil
		}
		select {
		case <-ctx.Done():
			return paced{}, ctx.Err()
		case <-t.C:
		}
	}
}

// slotState is where a container slot is in its cycle.
type slotState int

const (
	slotEmpty   slotState = iota // next: create and start a container
	slotRunning                  // next: stop it
	slotExited                   // next: remove it
)

// slot is a place for one container in a pod; the driver cycles it through
// start, stop and remove.
type slot struct {
	sandboxID string
	name      string
	id        string // the current container; empty while slotEmpty
	state     slotState
}

// pool is the simulated node the driver works on: pods whose container
// slots it visits in turn, one transition per visit. Consecutive visits go
// to different pods, and each slot is visited every len(slots) transitions,
// which is how long a container stays running, then exited. Only the
// driver's goroutine uses a pool.
type pool struct {
	model *crisim.Runtime
	slots []slot
	next  int
	track trackFunc
}

// trackFunc makes the transition tr by calling call, the runtime call, and
// tells whoever matches the acks about it: the tracker in the harness's
// process (tracker.track), or the parent through a record (the runtime's
// process, recordWriter.track). A transition whose call fails must not be
// counted. It returns call's error, or its own.
type trackFunc func(tr transition, measured bool, call func() error) error

// newPool creates the pods of n slots, containersPerPod a pod, in model,
// with a third of the slots holding a running container and a third an
// exited one, so that the driver makes starts, stops and removes in equal
// parts from the first transition on. It emits the events of that setup,
// which are not tracked; track is given the driver's transitions.
func newPool(model *crisim.Runtime, n, containersPerPod int, track trackFunc) (*pool, error) {
	pods := (n + containersPerPod - 1) / containersPerPod
	sandboxes := make([]string, pods)
	for i := range sandboxes {
		id, err := model.RunPodSandbox(crisim.PodConfig{Name: fmt.Sprintf("bench-%d", i), Namespace: podNamespace})
		if err != nil {
			return nil, fmt.Errorf("set up pod %d: %w", i, err)
		}
		sandboxes[i] = id
	}
	p := &pool{model: model, slots: make([]slot, n), track: track}
	for i := range p.slots {
		s := &p.slots[i]
		s.sandboxID, s.name = sandboxes[i%pods], fmt.Sprintf("c%d", i/pods)
		for range i % 3 {
			if err := p.step(s, false, untracked); err != nil {
				return nil, fmt.Errorf("set up slot %d: %w", i, err)
			}
		}
	}
	return p, nil
}

// transition makes the next transition of the next slot and tracks it,
// measured or not.
func (p *pool) transition(measured bool) error {
	s := &p.slots[p.next]
	p.next = (p.next + 1) % len(p.slots)
	return p.step(s, measured, p.track)
}

// untracked makes a transition of the pool's setup.
func untracked(_ transition, _ bool, call func() error) error { return call() }

// step moves s one transition on, made through track.
func (p *pool) step(s *slot, measured bool, track trackFunc) error {
	var tr transition
	var call func() error
	switch s.state {
	case slotEmpty:
		// Creating emits a CREATED event but no Lifecycle event: it is setup,
		// not the measured transition.
		id, err := p.model.CreateContainer(s.sandboxID, crisim.ContainerConfig{Name: s.name})
		if err != nil {
			return fmt.Errorf("create container: %w", err)
		}
		s.id = id
		tr = transition{id, generator.ContainerStarted}
		call = func() error { return p.model.StartContainer(id) }
	case slotRunning:
		tr = transition{s.id, generator.ContainerDied}
		call = func() error { return p.model.StopContainer(s.id, 0, "", "") }
	case slotExited:
		tr = transition{s.id, generator.ContainerRemoved}
		call = func() error { return p.model.RemoveContainer(s.id) }
	}
	if err := track(tr, measured, call); err != nil {
		return fmt.Errorf("%s of container %s: %w", tr.typ, tr.containerID, err)
	}
	s.state = (s.state + 1) % 3
	if s.state == slotEmpty {
		s.id = ""
	}
	return nil
}
