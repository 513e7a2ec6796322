package crisim

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// WorkloadsOptions configures Workloads. Zero fields get the defaults noted.
type WorkloadsOptions struct {
	// Seed makes the pods' UIDs and name suffixes repeatable.
	Seed int64
	// CrashAfter is how long a crash-looping container runs before it
	// fails; 0 means 2s.
	CrashAfter time.Duration
	// Backoff is the first restart delay of a crashed container; it doubles
	// at each restart up to MaxBackoff, as the kubelet's CrashLoopBackOff
	// does from 10s up to 5 minutes. 0 means 1s.
	Backoff time.Duration
	// MaxBackoff caps the restart delay; 0 means 5s.
	MaxBackoff time.Duration
	// JobEvery is how often a new Job pod starts; 0 means 15s.
	JobEvery time.Duration
}

func (o WorkloadsOptions) withDefaults() WorkloadsOptions {
	o.CrashAfter = cmp.Or(o.CrashAfter, 2*time.Second)
	o.Backoff = cmp.Or(o.Backoff, time.Second)
	o.MaxBackoff = cmp.Or(o.MaxBackoff, 5*time.Second)
	o.JobEvery = cmp.Or(o.JobEvery, 15*time.Second)
	return o
}

// Workloads runs the pods of a small cluster's namespaces the way a kubelet
// drives the runtime for them, so that a demo shows what lifecycle events
// are for. All pods carry the labels their controllers would set (app,
// pod-template-hash or job-name):
//
//   - shop/web-* (2 replicas) and payments/api-*: run until ctx ends.
//   - shop/checkout-* and payments/ledger-*: crash loops; the container
//     "app" exits 1 "Error" after CrashAfter and is started again in the
//     same sandbox with the next attempt number after a doubling backoff,
//     keeping only the last exited container, as the kubelet does.
//   - payments/cache-0: a container "redis" that is OOMKilled (exit 137)
//     after three times CrashAfter and restarted the same way.
//   - batch/report-<n>-*: a Job pod every JobEvery whose container "run"
//     completes (exit 0) after CrashAfter; the pod is removed one JobEvery
//     later, so that a completed Job is there to be seen for a while.
//
// It blocks until ctx is done and then returns nil, once every goroutine it
// started has ended; pods still there stay in rt as they are. It returns
// early with an error if an operation on rt fails.
func Workloads(ctx context.Context, rt *Runtime, opts WorkloadsOptions) error {
	opts = opts.withDefaults()
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // guards rng, shared by the goroutines below
		rng = rand.New(rand.NewPCG(uint64(opts.Seed), 0x3011))
	)
	pod := func(namespace, name, hash string, labels map[string]string) PodConfig {
		mu.Lock()
		defer mu.Unlock()
		var uid [16]byte
		for i := range uid {
			uid[i] = byte(rng.Uint32())
		}
		if hash != "" {
			// A ReplicaSet's pods are <deployment>-<hash>-<suffix>; the hash
			// is left out of the name to keep the demo's columns aligned.
			labels["pod-template-hash"] = hash
			name = name + "-" + suffix(rng)
		}
		return PodConfig{Name: name, Namespace: namespace, UID: formatUUID(uid), Labels: labels}
	}
	run := func(what string, fn func(context.Context) error) {
		wg.Go(func() {
			if err := fn(wctx); err != nil && wctx.Err() == nil {
				cancel(fmt.Errorf("workloads %s: %w", what, err))
			}
		})
	}

	for range 2 {
		p := pod("shop", "web", "7d9f6c8b5", map[string]string{"app": "web", "tier": "frontend"})
		run(p.Namespace+"/"+p.Name, func(ctx context.Context) error {
			return runUntilDone(ctx, rt, p, ContainerConfig{Name: "app", Image: "registry.example/shop/web:2.3"})
		})
	}
	api := pod("payments", "api", "5b7c9d4f8", map[string]string{"app": "api", "team": "payments"})
	run(api.Namespace+"/"+api.Name, func(ctx context.Context) error {
		return runUntilDone(ctx, rt, api, ContainerConfig{Name: "app", Image: "registry.example/payments/api:1.8"})
	})

	checkout := pod("shop", "checkout", "6c4d8f9b7", map[string]string{"app": "checkout", "tier": "backend"})
	run(checkout.Namespace+"/"+checkout.Name, func(ctx context.Context) error {
		return restartLoop(ctx, rt, checkout, ContainerConfig{Name: "app", Image: "registry.example/shop/checkout:0.9"},
			Exit{Code: 1, Reason: "Error"}, opts.CrashAfter, opts)
	})
	ledger := pod("payments", "ledger", "8f5b6d7c9", map[string]string{"app": "ledger", "team": "payments"})
	run(ledger.Namespace+"/"+ledger.Name, func(ctx context.Context) error {
		// Half a run later than checkout, so the two do not crash in step.
		if !sleep(ctx, opts.CrashAfter/2) {
			return nil
		}
		return restartLoop(ctx, rt, ledger, ContainerConfig{Name: "app", Image: "registry.example/payments/ledger:3.1"},
			Exit{Code: 1, Reason: "Error", Message: "connection refused: postgres:5432"}, opts.CrashAfter, opts)
	})
	cache := pod("payments", "cache-0", "", map[string]string{"app": "cache", "team": "payments", "statefulset.kubernetes.io/pod-name": "cache-0"})
	run(cache.Namespace+"/"+cache.Name, func(ctx context.Context) error {
		return restartLoop(ctx, rt, cache, ContainerConfig{Name: "redis", Image: "registry.example/redis:7.4"},
			Exit{Code: 137, Reason: "OOMKilled"}, 3*opts.CrashAfter, opts)
	})

	run("batch/report", func(ctx context.Context) error {
		for n := 0; ; n++ {
			job := fmt.Sprintf("report-%d", n)
			p := pod("batch", job, "", map[string]string{"app": "report", "job-name": job})
			mu.Lock()
			p.Name = job + "-" + suffix(rng)
			mu.Unlock()
			wg.Go(func() {
				plan := podPlan{
					pod: p, containers: []ContainerConfig{{Name: "run", Image: "registry.example/batch/report:1.0"}},
					runFor: opts.CrashAfter, exits: []Exit{{Code: 0, Reason: "Completed"}}, removeAfter: opts.JobEvery,
				}
				if _, err := runPod(ctx, rt, plan); err != nil && ctx.Err() == nil {
					cancel(fmt.Errorf("workloads batch/%s: %w", p.Name, err))
				}
			})
			if !sleep(ctx, opts.JobEvery) {
				return nil
			}
		}
	})

	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return context.Cause(wctx)
}

// suffix is a pod name's random suffix, as a ReplicaSet or Job gives it.
func suffix(rng *rand.Rand) string {
	const letters = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, 5)
	for i := range b {
		b[i] = letters[rng.IntN(len(letters))]
	}
	return string(b)
}

// sleep waits for d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runUntilDone runs a pod with one container until ctx is done.
func runUntilDone(ctx context.Context, rt *Runtime, p PodConfig, c ContainerConfig) error {
	sb, err := rt.RunPodSandbox(p)
	if err != nil {
		return err
	}
	id, err := rt.CreateContainer(sb, c)
	if err != nil {
		return err
	}
	if err := rt.StartContainer(id); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// restartLoop runs a pod whose container ends with exit after runFor, every
// time: the kubelet starts it again in the same sandbox with the next
// attempt number after a backoff that doubles up to opts.MaxBackoff, and
// keeps the last exited container only, removing the one before it.
func restartLoop(ctx context.Context, rt *Runtime, p PodConfig, c ContainerConfig, exit Exit, runFor time.Duration, opts WorkloadsOptions) error {
	sb, err := rt.RunPodSandbox(p)
	if err != nil {
		return err
	}
	backoff := opts.Backoff
	var previous string // the last exited container, kept as the kubelet does
	for attempt := uint32(0); ; attempt++ {
		c.Attempt = attempt
		id, err := rt.CreateContainer(sb, c)
		if err != nil {
			return err
		}
		if err := rt.StartContainer(id); err != nil {
			return err
		}
		if !sleep(ctx, runFor) {
			return nil
		}
		if err := rt.StopContainer(id, exit.Code, exit.Reason, exit.Message); err != nil {
			return err
		}
		if previous != "" {
			if err := rt.RemoveContainer(previous); err != nil {
				return err
			}
		}
		previous = id
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, opts.MaxBackoff)
	}
}
