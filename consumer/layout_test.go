package consumer_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// bothLayouts publishes, as a bridge upgraded over an old stream does, the
// events of pods in two namespaces in the legacy subject layout, then more
// in the current one, and returns them in stream order.
func bothLayouts(t *testing.T, js jetstream.JetStream) []consumer.Event {
	t.Helper()
	var fs []fixture
	for _, legacy := range []bool{true, false} {
		for _, f := range podEvents(4, 2) {
			f.legacy = legacy
			if f.pod == "web-1" || f.pod == "web-3" {
				f.namespace = "payments"
			}
			f.containerID += map[bool]string{true: "-old", false: "-new"}[legacy]
			fs = append(fs, f)
		}
	}
	return publishEvents(t, js, fs...)
}

func only(events []consumer.Event, f consumer.Filter) []consumer.Event {
	var out []consumer.Event
	for _, e := range events {
		if f.Matches(e) {
			out = append(out, e)
		}
	}
	return out
}

func TestReplayReadsBothSubjectLayouts(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	all := bothLayouts(t, js)
	for _, f := range []consumer.Filter{
		{},
		{Node: "node-1"},
		{Namespace: "default"},
		{Namespace: "payments", Type: "died"},
		{PodUID: all[1].PodUID},
		{Namespace: "default", PodName: "web-2"},
	} {
		want := only(all, f)
		if len(want) == 0 {
			t.Fatalf("filter %+v selects %d of %d events: not a test", f, len(want), len(all))
		}
		got := replayAll(t, js, consumer.Options{Filter: f})
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Replay with %+v (-want +got):\n%s", f, diff)
		}
	}
}

func TestReplayOfTheCurrentLayoutAloneAsksForOneSubject(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	all := publishEvents(t, js, podEvents(2, 2)...)
	got := replayAll(t, js, consumer.Options{Filter: consumer.Filter{Namespace: "default"}})
	if diff := cmp.Diff(all, got); diff != "" {
		t.Errorf("Replay (-want +got):\n%s", diff)
	}
}

func TestConsumeReadsBothSubjectLayouts(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	all := bothLayouts(t, js)
	f := consumer.Filter{Namespace: "payments"}
	want := only(all, f)
	calls := make(chan consumer.Event)
	opts := consumer.DurableOptions{Name: "tenant", DeliverAll: true, Partitions: 1, OnDeadLetter: ignoreDeadLetters, Filter: f}
	startMember(t, url, opts, handled(calls, nil))
	if diff := cmp.Diff(want, receive(t, calls, len(want))); diff != "" {
		t.Errorf("handler got (-want +got):\n%s", diff)
	}
	checkDrained(t, js, opts)
}

// A group made before the namespace token has a work stream whose one
// source has the legacy transform. Its members handled the legacy events;
// then the bridges were upgraded, and then the group's service. Consume
// gives the source the current layout's transform and goes on with the new
// events: every one, none of the handled ones again.
func TestConsumeUpgradesAGroupMadeBeforeTheNamespaceToken(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	opts := consumer.DurableOptions{Name: "old", DeliverAll: true, Partitions: 1, OnDeadLetter: ignoreDeadLetters}
	ws, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: opts.WorkStream(),
		Sources: []*jetstream.StreamSource{{
			Name: "PLEG",
			SubjectTransforms: []jetstream.SubjectTransformConfig{{
				Source:      "pleg.*.*.*",
				Destination: "{{partition(1,2)}}.pleg.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}",
			}},
		}},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
	})
	if err != nil {
		t.Fatalf("create the old group's work stream: %v", err)
	}
	all := bothLayouts(t, js)
	var legacy, current []consumer.Event
	for _, e := range all {
		if strings.Count(e.NATSSubject, ".") == 3 {
			legacy = append(legacy, e)
		} else {
			current = append(current, e)
		}
	}
	// The old member, as the old library made it, handles the legacy events.
	old, err := ws.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{
		Durable: "old-0", FilterSubject: "0.>", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1,
	})
	if err != nil {
		t.Fatalf("create the old group's consumer: %v", err)
	}
	for range legacy {
		msg, err := old.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("old member: %v", err)
		}
		if err := msg.DoubleAck(t.Context()); err != nil {
			t.Fatalf("old member: ack: %v", err)
		}
	}

	calls := make(chan consumer.Event)
	startMember(t, url, opts, handled(calls, nil))
	if diff := cmp.Diff(current, receive(t, calls, len(current))); diff != "" {
		t.Errorf("handler got (-want +got):\n%s", diff)
	}
	// Nothing left to deliver: no legacy event came twice.
	checkDrained(t, js, opts)
}

// A namespace-scoped reader receives its namespace's events and nothing
// else: the bytes its connection receives, from a stream of 50 namespaces,
// are those of its own events plus the protocol's. Before the namespace
// token (the same events in the legacy layout) it received all 50.
func TestReplayOfANamespaceReceivesOnlyItsBytes(t *testing.T) {
	t.Parallel()
	const namespaces, perNamespace = 50, 20
	received := func(legacy bool) (got []consumer.Event, in uint64, own int) {
		t.Helper()
		_, url := publishtest.NewServer(t)
		_, js := publishtest.Connect(t, url)
		if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
			t.Fatal(err)
		}
		var fs []fixture
		for i := range perNamespace {
			for n := range namespaces {
				f := died()
				f.legacy = legacy
				f.namespace = fmt.Sprintf("team-%02d", n)
				f.podUID = fmt.Sprintf("6f1c2a7e-0000-4000-8000-%06d%06d", n, i)
				f.containerID = fmt.Sprintf("c-%d-%d", n, i)
				fs = append(fs, f)
			}
		}
		for _, e := range publishEvents(t, js, fs...) {
			if e.Data.Pod.Namespace == "team-07" {
				own += len(e.NATSSubject) + len(e.RawData)
			}
		}
		nc, rjs := publishtest.Connect(t, url)
		before := nc.Stats().InBytes
		if err := consumer.Replay(t.Context(), rjs, consumer.Options{Filter: consumer.Filter{Namespace: "team-07"}}, collect(&got)); err != nil {
			t.Fatal(err)
		}
		return got, nc.Stats().InBytes - before, own
	}
	got, in, own := received(false)
	if len(got) != perNamespace {
		t.Fatalf("replay of one namespace delivered %d events, want %d", len(got), perNamespace)
	}
	gotLegacy, inLegacy, _ := received(true)
	if len(gotLegacy) != perNamespace {
		t.Fatalf("replay of one namespace in the legacy layout delivered %d events, want %d", len(gotLegacy), perNamespace)
	}
	t.Logf("a replay of 1 namespace of %d: %d bytes received (its events' subjects and data: %d); legacy layout: %d bytes (%.1fx)",
		namespaces, in, own, inLegacy, float64(inLegacy)/float64(in))
	// Each message carries its body (more than the data) and headers; a
	// replay adds its requests' replies. Three times the data is a wide
	// bound that one other namespace's share already breaks.
	if in > uint64(3*own) {
		t.Errorf("replay of one namespace received %d bytes, want at most 3x its own events' %d", in, own)
	}
	if inLegacy < uint64(namespaces/2)*in {
		t.Errorf("replay of the legacy layout received %d bytes, want about %d times the %d of the current one", inLegacy, namespaces, in)
	}
}
