package crisim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// workloadExit is one container's end as the event stream reports it.
type workloadExit struct {
	Namespace, Pod, Container string
	Attempt                   uint32
	Code                      int32
	Reason                    string
	At                        time.Time
}

func TestWorkloadsShowCrashLoopsAnOOMKillAndACompletedJobWithin30Seconds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		sub := rt.Subscribe(t.Context())
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := Workloads(ctx, rt, WorkloadsOptions{Seed: 1}); err != nil {
			t.Fatalf("Workloads: %v", err)
		}

		var (
			exits       []workloadExit
			labelled    = map[string]map[string]string{} // namespace/app -> labels
			removedPods = map[string]bool{}
		)
		for _, ev := range drain(sub) {
			sb := ev.GetPodSandboxStatus()
			md := sb.GetMetadata()
			labelled[md.GetNamespace()+"/"+sb.GetLabels()["app"]] = sb.GetLabels()
			if ev.ContainerId == sb.GetId() {
				if ev.ContainerEventType == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
					removedPods[md.GetNamespace()+"/"+md.GetName()] = true
				}
				continue
			}
			if ev.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
				continue
			}
			for _, st := range ev.ContainersStatuses {
				if st.Id == ev.ContainerId {
					exits = append(exits, workloadExit{md.GetNamespace(), md.GetName(), st.Metadata.Name, st.Metadata.Attempt, st.ExitCode, st.Reason, time.Unix(0, st.FinishedAt)})
				}
			}
		}

		byPod := map[string][]workloadExit{}
		for _, e := range exits {
			byPod[e.Namespace+"/"+e.Pod] = append(byPod[e.Namespace+"/"+e.Pod], e)
		}
		var crashLoops, ooms, jobs int
		for pod, es := range byPod {
			switch es[0].Reason {
			case "Error":
				crashLoops++
				// 2s runs after backoffs of 1s, 2s, 4s, 5s...: the third
				// crash comes at 12s at the latest.
				if len(es) < 3 {
					t.Errorf("%s crashed %d times in 30s, want at least 3: %+v", pod, len(es), es)
				}
				for i, e := range es {
					if e.Attempt != uint32(i) || e.Code != 1 {
						t.Errorf("%s crash %d: %+v, want attempt %d with exit code 1", pod, i, e, i)
					}
					// Once the backoff is capped, a crash every 7s at most:
					// a crash-loop detector that starts at any moment sees
					// 3 crashes within 21s.
					if i > 0 {
						if gap := e.At.Sub(es[i-1].At); gap > 7*time.Second {
							t.Errorf("%s crashed %v after the crash before, want 7s at most", pod, gap)
						}
					}
				}
			case "OOMKilled":
				ooms++
				if es[0].Code != 137 || es[0].Container != "redis" {
					t.Errorf("%s: %+v, want redis OOMKilled with exit code 137", pod, es[0])
				}
			case "Completed":
				jobs++
				if es[0].Namespace != "batch" || es[0].Code != 0 || len(es) != 1 {
					t.Errorf("%s: %+v, want one container of a Job completing with 0", pod, es)
				}
			default:
				t.Errorf("%s: unexpected exit %+v", pod, es[0])
			}
		}
		if crashLoops != 2 || ooms != 1 || jobs < 2 {
			t.Errorf("%d crash loops, %d OOMKilled pods, %d completed Jobs in 30s; want 2, 1 and at least 2:\n%+v", crashLoops, ooms, jobs, exits)
		}
		firstJob := ""
		for k := range byPod {
			if strings.HasPrefix(k, "batch/report-0-") {
				firstJob = k
			}
		}
		if !removedPods[firstJob] {
			t.Errorf("the first Job's pod was not removed in 30s; removed: %v", removedPods)
		}

		var namespaces []string
		for k, labels := range labelled {
			if labels["app"] == "" {
				t.Errorf("pods of %s have no app label: %v", k, labels)
			}
			ns, _, _ := strings.Cut(k, "/")
			if !slices.Contains(namespaces, ns) {
				namespaces = append(namespaces, ns)
			}
		}
		slices.Sort(namespaces)
		if d := cmp.Diff([]string{"batch", "payments", "shop"}, namespaces); d != "" {
			t.Errorf("namespaces (-want +got):\n%s", d)
		}
	})
}

func TestWorkloadsKeepOnlyTheLastExitedContainerOfACrashLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		if err := Workloads(ctx, rt, WorkloadsOptions{Seed: 1}); err != nil {
			t.Fatalf("Workloads: %v", err)
		}
		perPod := map[string][]string{}
		for _, c := range rt.ListContainers(nil) {
			if c.Labels["io.kubernetes.pod.namespace"] == "shop" && c.Metadata.Name == "app" {
				perPod[c.Labels["io.kubernetes.pod.name"]] = append(perPod[c.Labels["io.kubernetes.pod.name"]], fmt.Sprint(c.Metadata.Attempt, c.State))
			}
		}
		if len(perPod) != 3 {
			t.Errorf("app containers of %d pods in shop, want 3 (two web, one checkout): %v", len(perPod), perPod)
		}
		for pod, cs := range perPod {
			if len(cs) > 2 {
				t.Errorf("%s holds %d app containers %v, want the running one and the last exited at most", pod, len(cs), cs)
			}
		}
	})
}
