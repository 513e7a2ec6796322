package generator

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

type discardSink struct{ events int }

func (s *discardSink) Send(_ context.Context, evs []Event) error {
	s.events += len(evs)
	return nil
}

// streamEvents records the wire form of the events of n container
// lifecycles (created, started, stopped, removed) in pods of four, as a
// containerd 2.x event stream carries them: each with the statuses of all
// its pod's containers, labels and annotations included.
func streamEvents(b *testing.B, n int) [][]byte {
	b.Helper()
	model := crisim.NewRuntime(crisim.Containerd24Options())
	sub := model.Subscribe(b.Context())
	var out [][]byte
	drain := func() {
		for {
			select {
			case ev := <-sub.Events():
				wire, err := proto.Marshal(ev)
				if err != nil {
					b.Fatal(err)
				}
				out = append(out, wire)
			default:
				return
			}
		}
	}
	for p := range n / 4 {
		sb, err := model.RunPodSandbox(crisim.PodConfig{Name: fmt.Sprintf("pod-%d", p), Namespace: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		var ids []string
		for c := range 4 {
			id, err := model.CreateContainer(sb, crisim.ContainerConfig{Name: fmt.Sprintf("c%d", c)})
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, id)
		}
		for _, op := range []func(string) error{
			model.StartContainer,
			func(id string) error { return model.StopContainer(id, 0, "Completed", "") },
			model.RemoveContainer,
		} {
			for _, id := range ids {
				if err := op(id); err != nil {
					b.Fatal(err)
				}
			}
		}
		drain()
	}
	return out
}

// BenchmarkStreamEventApply measures the generator's work for one event of
// the stream, from the decoded message to its Lifecycle events handed to the
// sink: the conversion to a partial pod view and the merge. The messages
// are decoded by protobuf beforehand, while the timer is stopped; the CRI
// client's decoding of them is package cri's BenchmarkStreamEventDecode. It
// leaves out the gRPC framing, the targeted relists the STOPPED and DELETED
// events ask for, and the publishing. ns/op and allocs/op are per stream
// event; a quarter of them (CREATED) produce no Lifecycle event.
func BenchmarkStreamEventApply(b *testing.B) {
	wire := streamEvents(b, 4000)
	ctx := b.Context()
	var g *Generator
	var sink *discardSink
	var evs []*runtimeapi.ContainerEventResponse
	i := len(wire)
	b.ReportAllocs()
	for b.Loop() {
		if i == len(wire) {
			b.StopTimer()
			sink = &discardSink{}
			g = New(nil, sink, Options{Mode: ModeEvented})
			evs = evs[:0]
			for _, w := range wire {
				ev := &runtimeapi.ContainerEventResponse{}
				if err := proto.Unmarshal(w, ev); err != nil {
					b.Fatal(err)
				}
				evs = append(evs, ev)
			}
			i = 0
			b.StartTimer()
		}
		if err := g.merge.applyStreamEvent(ctx, evs[i]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if sink.events == 0 {
		b.Fatal("the stream events produced no Lifecycle event")
	}
}
