package fleet

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// churnTick is how often the churn catches up with its rate: at 500
// transitions a second, five per tick.
const churnTick = 10 * time.Millisecond

// maxCatchUp bounds how far behind its rate the churn may fall and still
// make up for it, so that a stalled harness is not followed by a burst.
const maxCatchUp = 100 * time.Millisecond

// simNode is one simulated node: its runtime, served on a unix socket by
// the harness (a node's containerd outlives its bridge), and its churn.
type simNode struct {
	name   string
	socket string
	model  *crisim.Runtime
	srv    *crisim.Server
	churn  *soak.NodeChurn
	// populated are the ContainerStarted transitions of the pods the node
	// has before any bridge runs: the first relist must report them.
	populated []soak.Transition
}

// nodes are the fleet's simulated nodes. The runtimes serve from start
// until stop; Churn is the only caller that changes them.
type nodes struct {
	list      []*simNode
	stopServe context.CancelFunc
	served    chan error // one result per node's Serve
	// rollouts takes a rollout to Churn, which alone may step the nodes'
	// churns; one place, since a run has one rollout at a time.
	rollouts chan *rollout
}

// rollout is a rolling deployment or a drain asked of Churn, on top of
// the churn's rate, its runtime calls spread over span. A deployment
// replaces fraction of the fleet's pods; a drain (drainNodes > 0) ends
// every standing pod of its nodes and starts as many on the others.
// Churn sets the other fields, then closes done.
type rollout struct {
	fraction   float64
	drainNodes int
	span       time.Duration
	done       chan struct{}

	pods, of    int // pods replaced (or evicted), of the fleet's pods
	calls, made int // runtime calls made, transitions they made
	evictCalls  int // a drain's calls on the drained nodes, one transition each
	finished    time.Time
}

// nodeOptions describe the simulated nodes.
type nodeOptions struct {
	count            int
	pods             int // populated pods per node
	containersPerPod int
	lifetime         time.Duration // of the churn's pods
	seed             uint64
}

// startNodes populates count runtimes with kubelet-like pods and serves
// each on a socket under dir. The runtimes serve until stop, also after
// ctx is done. On error it stops what it started.
func startNodes(ctx context.Context, dir string, o nodeOptions) (_ *nodes, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the runtimes' directory: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ns := &nodes{stopServe: cancel, served: make(chan error, o.count), rollouts: make(chan *rollout, 1)}
	defer func() {
		if err != nil {
			ns.stop()
		}
	}()
	for i := range o.count {
		n := &simNode{name: fmt.Sprintf("node-%04d", i), socket: filepath.Join(dir, fmt.Sprintf("%d.sock", i))}
		n.model = crisim.NewRuntime(crisim.Containerd24Options())
		at := time.Now()
		if o.pods > 0 {
			if err := n.model.PopulateKubelet(o.pods, o.pods*o.containersPerPod); err != nil {
				return nil, fmt.Errorf("populate %s: %w", n.name, err)
			}
		}
		n.populated = running(n.model, at)
		n.churn = soak.NewNodeChurn(n.model, soak.ChurnOptions{
			ContainersPerPod: o.containersPerPod, Lifetime: o.lifetime, Seed: o.seed + uint64(i),
		})
		n.srv = crisim.NewServer(n.model, crisim.ServerOptions{})
		lis, err := crisim.Listen(n.socket)
		if err != nil {
			return nil, fmt.Errorf("serve the runtime of %s: %w", n.name, err)
		}
		ns.list = append(ns.list, n)
		go func() { ns.served <- n.srv.Serve(sctx, lis) }() // joined by stop
	}
	return ns, nil
}

// running returns a ContainerStarted transition at at for each running
// sandbox and container of model.
func running(model *crisim.Runtime, at time.Time) []soak.Transition {
	var ts []soak.Transition
	uids := map[string]string{}
	for _, sb := range model.ListPodSandbox(nil) {
		uids[sb.GetId()] = sb.GetMetadata().GetUid()
		if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
			ts = append(ts, soak.Transition{ContainerID: sb.GetId(), PodUID: sb.GetMetadata().GetUid(), Sandbox: true, Type: soak.ContainerStarted, At: at})
		}
	}
	for _, c := range model.ListContainers(nil) {
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			ts = append(ts, soak.Transition{ContainerID: c.GetId(), PodUID: uids[c.GetPodSandboxId()], Type: soak.ContainerStarted, At: at})
		}
	}
	return ts
}

// Churn makes transitions at rate, fleet-wide, until ctx is done, then
// returns nil: each step goes to the next node in turn, which makes its
// pod most overdue take its next step, or starts a new pod. A rollout
// sent on ns.rollouts is made on top of that rate, its calls spread over
// its span, the nodes in turn. It returns an error if a runtime refuses a
// call. It starts no goroutine.
func (ns *nodes) Churn(ctx context.Context, rate float64) error {
	ticker := time.NewTicker(churnTick)
	defer ticker.Stop()
	base, done, next := time.Now(), 0, 0
	var roll *rolling
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-ns.rollouts:
			roll = ns.plan(r)
			continue
		case <-ticker.C:
		}
		owed := int(time.Since(base).Seconds()*rate) - done
		if burst := max(1, int(maxCatchUp.Seconds()*rate)); owed > burst {
			done += owed - burst
			owed = burst
		}
		for owed > 0 {
			n := ns.list[next%len(ns.list)]
			next++
			made, err := n.churn.Step()
			if err != nil {
				return fmt.Errorf("churn %s: %w", n.name, err)
			}
			// A step that made no transition (a stop of what had exited)
			// still counts, so that the loop always ends.
			owed -= max(made, 1)
			done += max(made, 1)
		}
		if roll != nil {
			finished, err := roll.step()
			if err != nil {
				return err
			}
			if finished {
				roll = nil
			}
		}
	}
}

// plan plans r over the nodes: each replaces its share of the fleet's
// pods, counted now, from its oldest.
func (ns *nodes) plan(r *rollout) *rolling {
	ready := &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}
	for _, n := range ns.list {
		r.of += len(n.model.ListPodSandbox(ready))
	}
	roll := &rolling{r: r, began: time.Now()}
	if r.drainNodes > 0 {
		ns.planDrain(r, roll)
		return roll
	}
	k := int(math.Ceil(r.fraction * float64(r.of)))
	for i, n := range ns.list {
		share := k / len(ns.list)
		if i < k%len(ns.list) {
			share++
		}
		pods, calls := n.churn.Replace(share)
		r.pods += pods
		roll.calls += calls
		if calls > 0 {
			roll.nodes = append(roll.nodes, n)
		}
	}
	return roll
}

// planDrain plans a drain of the last r.drainNodes nodes: each evicts
// every standing pod, and the other nodes adopt as many new pods, in turn.
// A fleet of drained nodes only adopts nothing.
func (ns *nodes) planDrain(r *rollout, roll *rolling) {
	k := min(r.drainNodes, len(ns.list))
	victims, others := ns.list[len(ns.list)-k:], ns.list[:len(ns.list)-k]
	for _, n := range victims {
		pods, calls := n.churn.Evict()
		r.pods += pods
		r.evictCalls += calls
		roll.calls += calls
		if calls > 0 {
			roll.nodes = append(roll.nodes, n)
		}
	}
	if len(others) == 0 {
		return
	}
	adopting := map[*simNode]bool{}
	for i := range r.pods {
		n := others[i%len(others)]
		roll.calls += n.churn.Adopt(1)
		if !adopting[n] {
			adopting[n] = true
			roll.nodes = append(roll.nodes, n)
		}
	}
}

// rolling is a rollout in progress: its calls are made at calls/span,
// the nodes that have some left in turn. A late harness catches up in
// bursts of at most maxCatchUp's share, and drops none: the rollout ends
// once every call is made, after its span if it must.
type rolling struct {
	r     *rollout
	began time.Time
	calls int        // planned
	nodes []*simNode // those with calls left
	next  int        // in nodes
}

// step makes the calls owed by now and reports whether the rollout
// finished; then r.done is closed.
func (g *rolling) step() (finished bool, err error) {
	share := min(time.Since(g.began).Seconds()/g.r.span.Seconds(), 1)
	owed := int(share*float64(g.calls)) - g.r.calls
	owed = min(owed, max(1, int(float64(g.calls)*maxCatchUp.Seconds()/g.r.span.Seconds())))
	for owed > 0 && len(g.nodes) > 0 {
		g.next %= len(g.nodes)
		n := g.nodes[g.next]
		made, ok, err := n.churn.Roll()
		if err != nil {
			return false, fmt.Errorf("rollout on %s: %w", n.name, err)
		}
		if !ok {
			g.nodes = slices.Delete(g.nodes, g.next, g.next+1)
			continue
		}
		g.next++
		g.r.calls++
		g.r.made += made
		owed--
	}
	if g.r.calls < g.calls && len(g.nodes) > 0 {
		return false, nil
	}
	g.r.finished = time.Now()
	close(g.r.done)
	return true, nil
}

// count returns the transitions made so far, the populated pods' included.
func (ns *nodes) count() int {
	total := 0
	for _, n := range ns.list {
		total += len(n.populated) + n.churn.Count()
	}
	return total
}

// transitions returns every transition made, node by node.
func (ns *nodes) transitions() []soak.Transition {
	var ts []soak.Transition
	for _, n := range ns.list {
		ts = append(ts, n.populated...)
		ts = append(ts, n.churn.Transitions()...)
	}
	return ts
}

// stop stops serving every runtime and returns the first Serve error.
func (ns *nodes) stop() error {
	ns.stopServe()
	var first error
	for range ns.list {
		if err := <-ns.served; err != nil && first == nil {
			first = err
		}
	}
	return first
}
