package generator_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// statusResult is what one PodStatusNewerThan call returned.
type statusResult struct {
	status generator.PodStatus
	ok     bool
	err    error
}

// podStatusNewerThan calls PodStatusNewerThan in a goroutine, so that a test
// can see whether it is still blocked (synctest.Wait, then a receive with a
// default).
func podStatusNewerThan(ctx context.Context, gen *generator.Generator, podUID string, t time.Time) <-chan statusResult {
	out := make(chan statusResult, 1)
	go func() {
		st, ok, err := gen.PodStatusNewerThan(ctx, podUID, t)
		out <- statusResult{st, ok, err}
	}()
	return out
}

// summary renders a status as "<id> <state> <exit code>" per container, with
// IDs replaced by the names given.
func summary(st generator.PodStatus, names map[string]string) []string {
	var out []string
	for _, c := range st.Containers {
		exit := "-"
		if c.ExitCode != nil {
			exit = fmt.Sprint(*c.ExitCode)
		}
		out = append(out, names[c.Container.ID]+" "+string(c.State)+" "+exit)
	}
	return out
}

func TestPodStatusNewerThan(t *testing.T) {
	t.Parallel()
	t.Run("waits for the stream to report the pod's change", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			f := newFixture(t, crisim.Containerd24Options(), generator.Options{Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour})
			ctx, stop := t.Context(), f.start(t)
			synctest.Wait()
			since := time.Now()
			got := podStatusNewerThan(ctx, f.gen, "uid-1", since)
			advance(time.Millisecond)
			select {
			case r := <-got:
				t.Fatalf("PodStatusNewerThan returned %+v before the pod existed", r)
			default:
			}

			m := f.rt.Model()
			sb := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1"}))
			synctest.Wait()
			r := <-got
			if r.err != nil || !r.ok {
				t.Fatalf("PodStatusNewerThan = %+v", r)
			}
			if id := r.status.Pod; id.UID != "uid-1" || id.Namespace != "shop" || id.Name != "web-0" || !r.status.ObservedAt.After(since) {
				t.Errorf("pod %+v observed at %v, want uid-1 after %v", r.status.Pod, r.status.ObservedAt, since)
			}
			c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
			advance(time.Millisecond)
			r = <-podStatusNewerThan(ctx, f.gen, "uid-1", r.status.ObservedAt)
			names := map[string]string{sb: "sb", c: "c"}
			if diff := cmp.Diff([]string{"sb running -", "c created -"}, summary(r.status, names)); diff != "" {
				t.Errorf("status after the container's creation (-want +got):\n%s", diff)
			}
			must(0, m.StartContainer(c))
			must(0, m.StopContainer(c, 3, "Error", ""))
			must(0, m.RemoveContainer(c))
			advance(time.Millisecond)
			r = <-podStatusNewerThan(ctx, f.gen, "uid-1", r.status.ObservedAt)
			if diff := cmp.Diff([]string{"sb running -", "c removed 3"}, summary(r.status, names)); diff != "" {
				t.Errorf("status after the container's removal (-want +got):\n%s", diff)
			}
			stop()
		})
	})
	t.Run("a relist after the time answers for a pod it did not find", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			f := newFixture(t, crisim.Options{}, generator.Options{Mode: generator.ModeGeneric, RelistPeriod: time.Second})
			ctx, stop := t.Context(), f.start(t)
			synctest.Wait()
			since := time.Now()
			got := podStatusNewerThan(ctx, f.gen, "uid-none", since)
			advance(time.Second - time.Millisecond)
			select {
			case r := <-got:
				t.Fatalf("PodStatusNewerThan returned %+v before a relist began after its time", r)
			default:
			}
			advance(time.Millisecond)
			select {
			case r := <-got:
				if r.ok || r.err != nil {
					t.Errorf("PodStatusNewerThan of a pod no relist found = %+v, want false and no error", r)
				}
			default:
				t.Fatal("PodStatusNewerThan still blocked after the next relist")
			}
			stop()
		})
	})
	t.Run("gives up when its ctx ends", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			f := newFixture(t, crisim.Options{}, generator.Options{})
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			st, ok, err := f.gen.PodStatusNewerThan(ctx, "uid-1", time.Now())
			if !errors.Is(err, context.DeadlineExceeded) || ok {
				t.Errorf("PodStatusNewerThan without Run = %+v, %v, %v; want the ctx's error", st, ok, err)
			}
		})
	})
}
