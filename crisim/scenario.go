package crisim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Exit is how a container ends: its exit code, reason and message as the
// runtime reports them. An empty Reason is filled in as StopContainer does.
type Exit struct {
	Code    int32
	Reason  string
	Message string
	// Weight is the relative frequency of this exit in ChurnOptions.Exits
	// (0 counts as 1); Lifecycle ignores it.
	Weight int
}

// Pod names the ids of a sandbox and its containers.
type Pod struct {
	SandboxID    string
	ContainerIDs []string
}

// LifecycleOptions describes one pod's life for Lifecycle.
type LifecycleOptions struct {
	Pod PodConfig
	// Containers are created and started in order; nil means one container
	// with the defaults of ContainerConfig.
	Containers []ContainerConfig
	// RunFor is how long the containers run before they exit.
	RunFor time.Duration
	// Exit is how every container ends; the zero value is exit code 0,
	// "Completed".
	Exit Exit
}

// Lifecycle runs one pod through its whole life, as a kubelet would drive
// the runtime: run the sandbox, create and start the containers, let them
// run for RunFor, stop them with the given exit, remove them, then stop and
// remove the sandbox. It blocks for RunFor. If ctx ends first, it returns
// ctx.Err() and leaves the pod running. The returned Pod names the ids used,
// also on error.
func Lifecycle(ctx context.Context, rt *Runtime, opts LifecycleOptions) (Pod, error) {
	containers := opts.Containers
	if containers == nil {
		containers = []ContainerConfig{{}}
	}
	exits := make([]Exit, len(containers))
	for i := range exits {
		exits[i] = opts.Exit
	}
	return runPod(ctx, rt, podPlan{pod: opts.Pod, containers: containers, runFor: opts.RunFor, exits: exits})
}

// podPlan is the life of one pod: its containers end with the exit of the
// same index.
type podPlan struct {
	pod        PodConfig
	containers []ContainerConfig
	runFor     time.Duration
	exits      []Exit
	// removeAfter is how long the exited containers stay before they and
	// the sandbox are removed.
	removeAfter time.Duration
}

func runPod(ctx context.Context, rt *Runtime, plan podPlan) (Pod, error) {
	var pod Pod
	var err error
	pod.SandboxID, err = rt.RunPodSandbox(plan.pod)
	if err != nil {
		return pod, err
	}
	for _, cfg := range plan.containers {
		id, err := rt.CreateContainer(pod.SandboxID, cfg)
		if err != nil {
			return pod, err
		}
		pod.ContainerIDs = append(pod.ContainerIDs, id)
		if err := rt.StartContainer(id); err != nil {
			return pod, err
		}
	}
	if plan.runFor > 0 {
		t := time.NewTimer(plan.runFor)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return pod, ctx.Err()
		}
	}
	for i, id := range pod.ContainerIDs {
		e := plan.exits[i]
		if err := rt.StopContainer(id, e.Code, e.Reason, e.Message); err != nil {
			return pod, err
		}
	}
	if plan.removeAfter > 0 {
		t := time.NewTimer(plan.removeAfter)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return pod, ctx.Err()
		}
	}
	for _, id := range pod.ContainerIDs {
		if err := rt.RemoveContainer(id); err != nil {
			return pod, err
		}
	}
	if err := rt.StopPodSandbox(pod.SandboxID); err != nil {
		return pod, err
	}
	return pod, rt.RemovePodSandbox(pod.SandboxID)
}

// ChurnOptions configures Churn. Zero fields get the defaults noted.
type ChurnOptions struct {
	// PodsPerSecond is the rate at which pods start; it must be positive.
	PodsPerSecond float64
	// ContainersPerPod is the number of containers of each pod; 0 means 1.
	ContainersPerPod int
	// Lifetime is how long a pod's containers run, give or take 25%;
	// 0 means 10s.
	Lifetime time.Duration
	// Namespace of the pods; "" means "churn". Pods are named churn-<n>.
	Namespace string
	// Seed makes the pods' UIDs, lifetimes and exits repeatable.
	Seed int64
	// Exits is the weighted mix of container exits; nil means mostly exit 0
	// "Completed" (6), some exit 1 "Error" (3) and a few exit 137
	// "OOMKilled" (1).
	Exits []Exit
	// RemoveAfter is how long a pod's exited containers stay before they
	// and the sandbox are removed, as a kubelet keeps them until its next
	// cleanup; 0 removes them at once, before any relist could see them
	// exited.
	RemoveAfter time.Duration
}

// Churn starts pods at opts.PodsPerSecond, the first at once, and runs each
// through its life (see Lifecycle) with containers that run for about
// opts.Lifetime and exit with a code drawn from opts.Exits. It keeps to the
// rate: pod n starts n/PodsPerSecond after the first, and when Churn falls
// behind (its process had no CPU for a while) it starts the pods due at
// once rather than skip them. It blocks until ctx is done and then returns
// nil, once every goroutine it started has ended; pods still running at
// that moment stay in rt as they are. It returns early with an error if an
// operation on rt fails (another caller removed a churn pod, say).
//
// For a given seed the pods' names, UIDs, lifetimes and exits are the same
// on every run; their ids are random.
func Churn(ctx context.Context, rt *Runtime, opts ChurnOptions) error {
	if opts.PodsPerSecond <= 0 || math.IsInf(opts.PodsPerSecond, 0) || math.IsNaN(opts.PodsPerSecond) {
		return fmt.Errorf("churn: pods per second must be positive and finite, got %v", opts.PodsPerSecond)
	}
	if opts.ContainersPerPod < 0 {
		return fmt.Errorf("churn: containers per pod must not be negative, got %d", opts.ContainersPerPod)
	}
	if opts.Lifetime < 0 {
		return fmt.Errorf("churn: lifetime must not be negative, got %v", opts.Lifetime)
	}
	if opts.RemoveAfter < 0 {
		return fmt.Errorf("churn: remove-after must not be negative, got %v", opts.RemoveAfter)
	}
	if opts.ContainersPerPod == 0 {
		opts.ContainersPerPod = 1
	}
	if opts.Lifetime == 0 {
		opts.Lifetime = 10 * time.Second
	}
	if opts.Namespace == "" {
		opts.Namespace = "churn"
	}
	if opts.Exits == nil {
		opts.Exits = []Exit{
			{Code: 0, Reason: "Completed", Weight: 6},
			{Code: 1, Reason: "Error", Weight: 3},
			{Code: 137, Reason: "OOMKilled", Weight: 1},
		}
	}
	interval := max(time.Duration(float64(time.Second)/opts.PodsPerSecond), time.Nanosecond)

	// churnCtx ends the pods early when one of them fails.
	churnCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup

	rng := rand.New(rand.NewPCG(uint64(opts.Seed), 0x5eed))
	// A time.Ticker would drop the ticks missed while this goroutine waited
	// for a CPU, which on a busy node cost up to a quarter of the pods: wait for
	// each pod's own start time instead.
	start := time.Now()
	timer := time.NewTimer(interval) // reset before each wait
	defer timer.Stop()
	for n := 0; churnCtx.Err() == nil; n++ {
		plan := opts.plan(n, rng)
		wg.Go(func() {
			if _, err := runPod(churnCtx, rt, plan); err != nil && churnCtx.Err() == nil {
				cancel(fmt.Errorf("churn pod %s/%s: %w", plan.pod.Namespace, plan.pod.Name, err))
			}
		})
		if wait := time.Until(start.Add(time.Duration(n+1) * interval)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-churnCtx.Done():
			case <-timer.C:
			}
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return context.Cause(churnCtx)
}

// plan draws the n-th pod's life from rng.
func (opts ChurnOptions) plan(n int, rng *rand.Rand) podPlan {
	var uid [16]byte
	for i := range uid {
		uid[i] = byte(rng.Uint32())
	}
	plan := podPlan{
		// Labels as a workload controller sets them, so that the demo and
		// the soak carry pod labels through to the events.
		pod: PodConfig{Name: fmt.Sprintf("churn-%d", n), Namespace: opts.Namespace, UID: formatUUID(uid),
			Labels: map[string]string{"app": "churn", "pod-template-hash": fmt.Sprintf("%x", uid[:4])}},
		// 0.75 to 1.25 times the lifetime, so pods do not end in lockstep.
		runFor:      time.Duration(float64(opts.Lifetime) * (0.75 + 0.5*rng.Float64())),
		removeAfter: opts.RemoveAfter,
	}
	for i := range opts.ContainersPerPod {
		plan.containers = append(plan.containers, ContainerConfig{Name: containerName(i), Image: "registry.example/churn:1.0"})
		plan.exits = append(plan.exits, pickExit(opts.Exits, rng))
	}
	return plan
}

func pickExit(exits []Exit, rng *rand.Rand) Exit {
	if len(exits) == 0 {
		return Exit{}
	}
	weight := func(e Exit) int { return max(e.Weight, 1) }
	total := 0
	for _, e := range exits {
		total += weight(e)
	}
	k := rng.IntN(total)
	for _, e := range exits {
		if k < weight(e) {
			return e
		}
		k -= weight(e)
	}
	return exits[len(exits)-1] // not reached: k < total
}
