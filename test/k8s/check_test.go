package k8s

// The comparison of the stream with what the kubelet did. It needs no
// cluster, so its own tests run with go test ./... and show that each of its
// checks can fail.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// podTruth is what the API showed of a pod, over its life.
type podTruth struct {
	uid, name string
	labels    map[string]string
	image     string           // the main container's image, as the pod spec names it
	restarts  int32            // the main container's highest restartCount
	exitCodes map[string]int32 // exit code by container ID, from every terminated state shown
	deleted   bool
}

// check compares the events of namespace ns with what the API showed
// (truth) and what containerd still holds (present), and returns every
// problem. Each sandbox and container gets Started, Died and, once gone
// from containerd, Removed: each once, in that order. Each pod has one
// sandbox and containers of attempts 0 to its restart count, each started
// after the previous one died. The Died of a container whose exit the API
// showed has its exit code; for the pods deleted while the bridge was away
// (outage) a code is not required, as the container was gone before the
// bridge could read it. exitCodes counts the codes compared.
func check(truth map[string]podTruth, events []consumer.Event, present map[string]bool, ns, node string, outage map[string]bool) (problems []string, exitCodes int) {
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	type seen struct {
		types   []string
		seqs    []uint64
		sandbox bool
		name    string
		image   string
		attempt uint32
		exit    *int32
	}
	byPod := map[string]map[string]*seen{}
	for _, e := range events {
		if e.Data.Pod.Namespace != ns {
			continue
		}
		uid := e.Data.Pod.UID
		p, ok := truth[uid]
		if !ok {
			fail("event %s %s of pod %s/%s (UID %s), which the API never showed", e.LifecycleType(), e.ContainerID, ns, e.Data.Pod.Name, uid)
			continue
		}
		if e.Node != node || e.Data.Node != node {
			fail("%s: node %q/%q, want %q", e.ID, e.Node, e.Data.Node, node)
		}
		if e.PodUID != uid || e.Data.Pod.Name != p.name {
			fail("%s: pod %s (UID %s / %s), the API says %s", e.ID, e.Data.Pod.Name, e.PodUID, uid, p.name)
		}
		if !maps.Equal(e.Data.Pod.Labels, p.labels) {
			fail("%s of %s: labels %v, the API shows %v", e.LifecycleType(), p.name, e.Data.Pod.Labels, p.labels)
		}
		if byPod[uid] == nil {
			byPod[uid] = map[string]*seen{}
		}
		s := byPod[uid][e.ContainerID]
		if s == nil {
			s = &seen{sandbox: e.Data.Container.Sandbox, name: e.Data.Container.Name, image: e.Data.Container.Image, attempt: e.Data.Container.Attempt}
			byPod[uid][e.ContainerID] = s
		}
		s.types = append(s.types, e.LifecycleType())
		s.seqs = append(s.seqs, e.Sequence)
		if e.LifecycleType() == "ContainerDied" {
			s.exit = e.Data.ExitCode
		}
	}
	checked := 0
	for uid, p := range truth {
		cs := byPod[uid]
		if len(cs) == 0 {
			fail("no event of pod %s", p.name)
			continue
		}
		var sandboxes []string
		attempts := map[uint32]string{}
		for id, s := range cs {
			want := []string{"ContainerStarted", "ContainerDied", "ContainerRemoved"}
			if present[id] {
				want = want[:2]
			}
			if !slices.Equal(s.types, want) {
				fail("%s %s (sandbox %v, attempt %d): events %q, want %q once each in this order (still in containerd: %v)",
					p.name, id, s.sandbox, s.attempt, s.types, want, present[id])
			}
			if s.sandbox {
				sandboxes = append(sandboxes, id)
				continue
			}
			if s.name != "main" || s.image != p.image {
				fail("%s %s: container %q of image %q, the spec says main of %q", p.name, id, s.name, s.image, p.image)
			}
			if other, dup := attempts[s.attempt]; dup {
				fail("%s: two containers of attempt %d: %s and %s", p.name, s.attempt, other, id)
			}
			attempts[s.attempt] = id
			code, shown := p.exitCodes[id]
			switch {
			case shown && s.exit != nil && *s.exit != code:
				fail("%s %s: exit code %d, the API showed %d", p.name, id, *s.exit, code)
			case shown && s.exit == nil && !outage[p.name]:
				fail("%s %s: no exit code, the API showed %d", p.name, id, code)
			case shown && s.exit != nil:
				checked++
			}
		}
		if len(sandboxes) != 1 {
			fail("%s: %d sandboxes %q, want 1", p.name, len(sandboxes), sandboxes)
			continue
		}
		sb := cs[sandboxes[0]]
		for n := uint32(0); n <= uint32(p.restarts); n++ {
			id, ok := attempts[n]
			if !ok {
				fail("%s: no container of attempt %d (the API showed %d restarts): lost", p.name, n, p.restarts)
				continue
			}
			c := cs[id]
			if len(c.seqs) > 0 && len(sb.seqs) > 0 && c.seqs[0] < sb.seqs[0] {
				fail("%s: attempt %d started before its sandbox", p.name, n)
			}
			if prev, ok := attempts[n-1]; n > 0 && ok && len(cs[prev].seqs) > 1 && len(c.seqs) > 0 && c.seqs[0] < cs[prev].seqs[1] {
				fail("%s: attempt %d started before attempt %d died", p.name, n, n-1)
			}
		}
		if len(attempts) != int(p.restarts)+1 {
			fail("%s: %d containers, the API showed %d restarts", p.name, len(attempts), p.restarts)
		}
	}
	return problems, checked
}

// history is one pod's complete history in the stream: sandbox s, then
// containers c0 and c1 (attempts 0 and 1) exiting with 3, all removed.
func history(uid string) []consumer.Event {
	ev := func(typ, id string, sandbox bool, attempt uint32, exit *int32) consumer.Event {
		e := consumer.Event{Type: "pleg.v1." + typ, ContainerID: uid + id, PodUID: uid, Node: "node-1"}
		e.Data.Node = "node-1"
		e.Data.Pod.UID, e.Data.Pod.Namespace, e.Data.Pod.Name = uid, "ns", "pod-"+uid
		e.Data.Pod.Labels = map[string]string{"app": "churn"}
		e.Data.Container.Sandbox, e.Data.Container.Attempt, e.Data.ExitCode = sandbox, attempt, exit
		if !sandbox {
			e.Data.Container.Name, e.Data.Container.Image = "main", "work:1"
		}
		return e
	}
	three := int32(3)
	return []consumer.Event{
		ev("ContainerStarted", "s", true, 0, nil),
		ev("ContainerStarted", "c0", false, 0, nil),
		ev("ContainerDied", "c0", false, 0, &three),
		ev("ContainerStarted", "c1", false, 1, nil),
		ev("ContainerDied", "c1", false, 1, &three),
		ev("ContainerRemoved", "c0", false, 0, nil),
		ev("ContainerRemoved", "c1", false, 1, nil),
		ev("ContainerDied", "s", true, 0, nil),
		ev("ContainerRemoved", "s", true, 0, nil),
	}
}

func truthOf(uids ...string) map[string]podTruth {
	out := map[string]podTruth{}
	for _, uid := range uids {
		out[uid] = podTruth{uid: uid, name: "pod-" + uid, labels: map[string]string{"app": "churn"}, image: "work:1", restarts: 1,
			exitCodes: map[string]int32{uid + "c0": 3, uid + "c1": 3}, deleted: true}
	}
	return out
}

func sequenced(events []consumer.Event) []consumer.Event {
	for i := range events {
		events[i].Sequence = uint64(i + 1)
	}
	return events
}

func TestCheckAcceptsCompleteHistoriesAndFindsEachKindOfProblem(t *testing.T) {
	t.Parallel()
	complete := func() []consumer.Event { return append(history("a"), history("b")...) }
	without := func(i int) func([]consumer.Event) []consumer.Event {
		return func(e []consumer.Event) []consumer.Event { return slices.Delete(e, i, i+1) }
	}
	tests := []struct {
		name    string
		change  func([]consumer.Event) []consumer.Event
		present map[string]bool
		outage  map[string]bool
		want    string // in a problem; empty: none
	}{
		{name: "a complete history passes", change: func(e []consumer.Event) []consumer.Event { return e }},
		{name: "a missing Died is found", change: without(4), want: "events [\"ContainerStarted\" \"ContainerRemoved\"]"},
		{name: "a lost container is found", change: func(e []consumer.Event) []consumer.Event {
			return slices.DeleteFunc(e, func(e consumer.Event) bool { return e.ContainerID == "ac1" })
		}, want: "no container of attempt 1"},
		{name: "a repeated event is found", change: func(e []consumer.Event) []consumer.Event {
			return slices.Insert(e, 2, e[1])
		}, want: "want [\"ContainerStarted\" \"ContainerDied\" \"ContainerRemoved\"] once each"},
		{name: "a restart before the death is found", change: func(e []consumer.Event) []consumer.Event {
			e[2], e[3] = e[3], e[2]
			return e
		}, want: "attempt 1 started before attempt 0 died"},
		{name: "a container before its sandbox is found", change: func(e []consumer.Event) []consumer.Event {
			e[0], e[1] = e[1], e[0]
			return e
		}, want: "attempt 0 started before its sandbox"},
		{name: "other labels are found", change: func(e []consumer.Event) []consumer.Event {
			e[3].Data.Pod.Labels = map[string]string{"app": "other"}
			return e
		}, want: "labels map[app:other], the API shows map[app:churn]"},
		{name: "another exit code is found", change: func(e []consumer.Event) []consumer.Event {
			one := int32(1)
			e[2].Data.ExitCode = &one
			return e
		}, want: "exit code 1, the API showed 3"},
		{name: "a missing exit code is found", change: func(e []consumer.Event) []consumer.Event {
			e[2].Data.ExitCode = nil
			return e
		}, want: "no exit code, the API showed 3"},
		{name: "a missing exit code is accepted for a pod deleted in the outage", change: func(e []consumer.Event) []consumer.Event {
			e[2].Data.ExitCode = nil
			return e
		}, outage: map[string]bool{"pod-a": true}},
		{name: "a removal of what containerd holds is found", change: func(e []consumer.Event) []consumer.Event { return e },
			present: map[string]bool{"as": true}, want: "still in containerd: true"},
		{name: "a history without the removals containerd made is found", change: func(e []consumer.Event) []consumer.Event {
			return slices.DeleteFunc(e, func(e consumer.Event) bool { return e.ContainerID == "bs" && e.LifecycleType() == "ContainerRemoved" })
		}, want: "bs (sandbox true, attempt 0): events"},
		{name: "a pod the API never showed is found", change: func(e []consumer.Event) []consumer.Event {
			x := e[0]
			x.Data.Pod.UID = "x"
			return append(e, x)
		}, want: "which the API never showed"},
		{name: "another node is found", change: func(e []consumer.Event) []consumer.Event {
			e[1].Node = "node-2"
			return e
		}, want: `node "node-2"`},
		{name: "another image is found", change: func(e []consumer.Event) []consumer.Event {
			e[1].Data.Container.Image = "work:2"
			return e
		}, want: `of image "work:2", the spec says main of "work:1"`},
		{name: "a second sandbox is found", change: func(e []consumer.Event) []consumer.Event {
			x := e[0]
			x.ContainerID = "as2"
			return append(e, x)
		}, want: "2 sandboxes"},
		{name: "a pod without events is found", change: func(e []consumer.Event) []consumer.Event {
			return slices.DeleteFunc(e, func(e consumer.Event) bool { return e.PodUID == "b" })
		}, want: "no event of pod pod-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			problems, codes := check(truthOf("a", "b"), sequenced(tt.change(complete())), tt.present, "ns", "node-1", tt.outage)
			if tt.want == "" {
				if len(problems) != 0 {
					t.Errorf("problems %q, want none", problems)
				}
				if codes < 3 {
					t.Errorf("%d exit codes compared, want at least 3", codes)
				}
				return
			}
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("problems %q, want one saying %q", problems, tt.want)
			}
		})
	}
}
