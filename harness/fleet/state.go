package fleet

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// stateReadTimeout bounds the read of the whole state bucket at the end.
const stateReadTimeout = 2 * time.Minute

// maxListed bounds each list of findings in the report.
const maxListed = 20

// StateCheck is the state bucket against the runtimes, read once every
// bridge stopped (they write the bucket last).
type StateCheck struct {
	Want  int      // containers and sandboxes the runtimes hold that must have a key
	Keys  int      // live keys the bucket holds
	Diffs []string // the first maxListed differences, and a count of the rest
}

// checkState compares the bucket with every node's runtime: each
// container and sandbox that started or exited must have a key under its
// node holding its latest event (ContainerStarted while it runs,
// ContainerDied once it exited), and no key may name a container its
// node's runtime no longer has. The soak checks one node so; this reads
// the bucket once for the whole fleet.
func checkState(ctx context.Context, js jetstream.JetStream, ns *nodes) StateCheck {
	want := map[string]map[string]string{} // node -> container ID -> type
	var check StateCheck
	for _, n := range ns.list {
		w := map[string]string{}
		for _, sb := range n.model.ListPodSandbox(nil) {
			switch sb.GetState() {
			case runtimeapi.PodSandboxState_SANDBOX_READY:
				w[sb.GetId()] = soak.ContainerStarted
			case runtimeapi.PodSandboxState_SANDBOX_NOTREADY:
				w[sb.GetId()] = soak.ContainerDied
			}
		}
		for _, c := range n.model.ListContainers(nil) {
			switch c.GetState() {
			case runtimeapi.ContainerState_CONTAINER_RUNNING:
				w[c.GetId()] = soak.ContainerStarted
			case runtimeapi.ContainerState_CONTAINER_EXITED:
				w[c.GetId()] = soak.ContainerDied
			}
		}
		want[n.name] = w
		check.Want += len(w)
	}
	rctx, cancel := context.WithTimeout(ctx, stateReadTimeout)
	defer cancel()
	var diffs []string
	held, err := consumer.ListState(rctx, js, consumer.StateOptions{
		Bucket:  stateBucket,
		OnError: func(err error) { diffs = append(diffs, err.Error()) },
	})
	if err != nil {
		check.Diffs = []string{fmt.Sprintf("read the state bucket: %v", err)}
		return check
	}
	check.Keys = len(held)
	got := map[string]map[string]string{}
	for _, c := range held {
		if got[c.Ref.Node] == nil {
			got[c.Ref.Node] = map[string]string{}
		}
		got[c.Ref.Node][c.Ref.ContainerID] = c.Event.LifecycleType()
	}
	for node, w := range want {
		for id, typ := range w {
			switch g, ok := got[node][id]; {
			case !ok:
				diffs = append(diffs, fmt.Sprintf("%s: container %s: no key, want its %s", node, id, typ))
			case g != typ:
				diffs = append(diffs, fmt.Sprintf("%s: container %s: key holds its %s, want its %s", node, id, g, typ))
			}
		}
	}
	for node, g := range got {
		for id, typ := range g {
			if _, ok := want[node][id]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: container %s: key holds its %s, but the node's runtime has no such container", node, id, typ))
			}
		}
	}
	slices.Sort(diffs)
	if len(diffs) > maxListed {
		diffs = append(diffs[:maxListed], fmt.Sprintf("and %d more", len(diffs)-maxListed))
	}
	check.Diffs = diffs
	return check
}
