package crisim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestLifecycleLeavesThePodRunningWhenCancelled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		pod, err := Lifecycle(ctx, rt, LifecycleOptions{RunFor: time.Minute})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lifecycle error = %v, want context.DeadlineExceeded", err)
		}
		st, err := rt.ContainerStatus(pod.ContainerIDs[0])
		if err != nil || st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container after cancel: %v, %v; want running", st, err)
		}
	})
}

// churnExit is one container's end as the event stream reports it.
type churnExit struct {
	Pod, Container string
	Code           int32
	Reason         string
	Ran            time.Duration
}

// runChurn runs Churn for d of virtual time and returns the runtime and the
// container exits seen on the event stream, sorted.
func runChurn(t *testing.T, opts ChurnOptions, d time.Duration) (*Runtime, []churnExit) {
	t.Helper()
	rt := NewRuntime(Options{})
	sub := rt.Subscribe(t.Context())
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	if err := Churn(ctx, rt, opts); err != nil {
		t.Fatalf("Churn: %v", err)
	}
	var exits []churnExit
	for _, ev := range drain(sub) {
		if ev.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT || ev.ContainerId == ev.GetPodSandboxStatus().GetId() {
			continue
		}
		for _, st := range ev.ContainersStatuses {
			if st.Id == ev.ContainerId {
				exits = append(exits, churnExit{
					Pod: ev.PodSandboxStatus.Metadata.Name, Container: st.Metadata.Name,
					Code: st.ExitCode, Reason: st.Reason, Ran: time.Duration(st.FinishedAt - st.StartedAt),
				})
			}
		}
	}
	slices.SortFunc(exits, func(a, b churnExit) int {
		return strings.Compare(a.Pod+"/"+a.Container, b.Pod+"/"+b.Container)
	})
	return rt, exits
}

func TestChurnStartsPodsAtTheRate(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		opts := ChurnOptions{PodsPerSecond: 2, ContainersPerPod: 2, Lifetime: time.Second, Seed: 1}
		// Pods start at 0s, 0.5s, ... 10s: 21 of them. Each runs 0.75s to
		// 1.25s, so those started from 9.5s on are still running at 10.25s.
		rt, exits := runChurn(t, opts, 10*time.Second+250*time.Millisecond)

		s := rt.Stats()
		if s.SandboxesCreated != 21 || s.ContainersCreated != 42 {
			t.Errorf("created %d sandboxes and %d containers, want 21 and 42", s.SandboxesCreated, s.ContainersCreated)
		}
		if s.Sandboxes < 1 || s.Sandboxes > 3 {
			t.Errorf("%d pods still there after Churn returned, want the last 1 to 3", s.Sandboxes)
		}
		if want := 2 * (21 - s.Sandboxes); len(exits) != want {
			t.Errorf("%d containers exited, want %d", len(exits), want)
		}
		for _, e := range exits {
			if e.Ran < 750*time.Millisecond || e.Ran > 1250*time.Millisecond {
				t.Errorf("%s/%s ran %v, want about 1s", e.Pod, e.Container, e.Ran)
			}
			switch fmt.Sprint(e.Code, e.Reason) {
			case "0Completed", "1Error", "137OOMKilled":
			default:
				t.Errorf("%s/%s exited %d %q, not one of the default mix", e.Pod, e.Container, e.Code, e.Reason)
			}
		}
		// Churn stopped every goroutine it started: nothing changes any more.
		synctest.Wait()
		<-time.After(time.Minute)
		if after := rt.Stats(); after.Events != s.Events {
			t.Errorf("%d events emitted after Churn returned", after.Events-s.Events)
		}
	})
}

func TestChurnIsRepeatableForASeed(t *testing.T) {
	t.Parallel()
	run := func(seed int64) (exits []churnExit) {
		synctest.Test(t, func(t *testing.T) {
			opts := ChurnOptions{PodsPerSecond: 5, ContainersPerPod: 3, Lifetime: 2 * time.Second, Seed: seed}
			_, exits = runChurn(t, opts, 20*time.Second)
		})
		return exits
	}
	first, again, other := run(7), run(7), run(8)
	if len(first) < 200 {
		t.Fatalf("only %d exits", len(first))
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("same seed, different exits (-first +again):\n%s", diff)
	}
	if cmp.Equal(first, other) {
		t.Error("seeds 7 and 8 gave the same exits")
	}
	byCode := map[int32]int{}
	for _, e := range first {
		byCode[e.Code]++
	}
	if len(byCode) != 3 {
		t.Errorf("exit codes %v, want a mix of 0, 1 and 137", byCode)
	}
}

func TestChurnReturnsAFailedPodsError(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		errc := make(chan error, 1)
		go func() { errc <- Churn(t.Context(), rt, ChurnOptions{PodsPerSecond: 1, Lifetime: time.Minute}) }()
		synctest.Wait()
		// Someone else removes the first churn pod under its feet.
		sandboxes := rt.ListPodSandbox(nil)
		if len(sandboxes) != 1 {
			t.Fatalf("%d sandboxes, want the first churn pod", len(sandboxes))
		}
		if err := rt.RemovePodSandbox(sandboxes[0].Id); err != nil {
			t.Fatal(err)
		}
		err := <-errc
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "churn/churn-0") {
			t.Fatalf("Churn returned %v, want the NotFound error of pod churn/churn-0", err)
		}
	})
}

func TestChurnRejectsBadOptions(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	for _, opts := range []ChurnOptions{
		{},
		{PodsPerSecond: -1},
		{PodsPerSecond: 1, ContainersPerPod: -1},
		{PodsPerSecond: 1, Lifetime: -time.Second},
		{PodsPerSecond: 1, RemoveAfter: -time.Second},
	} {
		if err := Churn(t.Context(), rt, opts); err == nil {
			t.Errorf("Churn(%+v) succeeded, want an error", opts)
		}
	}
	if n := rt.Stats().SandboxesCreated; n != 0 {
		t.Errorf("rejected churns created %d pods", n)
	}
}

func TestChurnKeepsExitedContainersForRemoveAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		// One pod whose containers run 1 s (give or take 25%) and stay
		// exited 2 s more.
		go func() {
			done <- Churn(ctx, rt, ChurnOptions{PodsPerSecond: 0.001, ContainersPerPod: 2, Lifetime: time.Second, RemoveAfter: 2 * time.Second})
		}()
		exited := func() (n, all int) {
			for _, c := range rt.ListContainers(nil) {
				all++
				if c.State == runtimeapi.ContainerState_CONTAINER_EXITED {
					n++
				}
			}
			return n, all
		}
		time.Sleep(1300 * time.Millisecond) // past the longest run
		synctest.Wait()
		if n, all := exited(); n != 2 || all != 2 {
			t.Errorf("after the containers ran: %d of %d exited, want both there and exited", n, all)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if _, all := exited(); all != 0 || rt.Stats().Sandboxes != 0 {
			t.Errorf("after remove-after: %d containers and %d sandboxes left, want none", all, rt.Stats().Sandboxes)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}
