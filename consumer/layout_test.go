package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
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
	checkDrained(t, js, opts)
	select {
	case e := <-calls:
		t.Errorf("handler called again after the new events, for %s", e.NATSSubject)
	default:
	}
}
