package soak

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// stateReadTimeout bounds the read of the state bucket at the end.
const stateReadTimeout = 30 * time.Second

// checkState compares the bridge's state bucket, read once the bridge has
// stopped, with the runtime's containers: each container and sandbox that
// started or exited must have a key holding its latest event
// (ContainerStarted while it runs, ContainerDied once it exited), and no
// key may name a container the runtime no longer has. It returns a
// how many containers the runtime has that must have a key, and a
// description of each difference, at most maxListed of them and a count.
// The bucket is the bridge's default one (the soak does not set
// PLEG_STATE_BUCKET).
func checkState(ctx context.Context, js jetstream.JetStream, model *crisim.Runtime) (int, []string) {
	want := map[string]string{}
	for _, sb := range model.ListPodSandbox(nil) {
		switch sb.GetState() {
		case runtimeapi.PodSandboxState_SANDBOX_READY:
			want[sb.GetId()] = ContainerStarted
		case runtimeapi.PodSandboxState_SANDBOX_NOTREADY:
			want[sb.GetId()] = ContainerDied
		}
	}
	for _, c := range model.ListContainers(nil) {
		switch c.GetState() {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			want[c.GetId()] = ContainerStarted
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			want[c.GetId()] = ContainerDied
		}
	}
	rctx, cancel := context.WithTimeout(ctx, stateReadTimeout)
	defer cancel()
	var undecodable []string
	held, err := consumer.ListState(rctx, js, consumer.StateOptions{
		Filter:  consumer.StateFilter{Node: nodeName},
		OnError: func(err error) { undecodable = append(undecodable, err.Error()) },
	})
	if err != nil {
		return len(want), []string{fmt.Sprintf("read the state bucket: %v", err)}
	}
	got := map[string]string{}
	for _, c := range held {
		got[c.Ref.ContainerID] = c.Event.LifecycleType()
	}
	var diffs []string
	for id, typ := range want {
		switch g, ok := got[id]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("container %s: no key, want its %s", id, typ))
		case g != typ:
			diffs = append(diffs, fmt.Sprintf("container %s: key holds its %s, want its %s", id, g, typ))
		}
	}
	for id, typ := range got {
		if _, ok := want[id]; !ok {
			diffs = append(diffs, fmt.Sprintf("container %s: key holds its %s, but the runtime has no such container", id, typ))
		}
	}
	diffs = append(diffs, undecodable...)
	slices.Sort(diffs)
	if len(diffs) > maxListed {
		diffs = append(diffs[:maxListed], fmt.Sprintf("and %d more", len(diffs)-maxListed))
	}
	return len(want), diffs
}
