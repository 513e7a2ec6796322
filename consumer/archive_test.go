package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// newArchive makes the archive of the stream PLEG as a bridge with
// PLEG_ARCHIVE_MAX_AGE does.
func newArchive(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := publish.EnsureArchive(t.Context(), js, publish.ArchiveOptions{SubjectPrefix: "pleg", MaxAge: time.Hour}); err != nil {
		t.Fatalf("ensure archive: %v", err)
	}
}

// waitArchived waits until the archive holds n messages.
func waitArchived(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	publishtest.ReadStream(t, js, schemas.ArchiveName("PLEG"), n)
}

// stored strips what differs between a stream and its archive: the
// sequence and the NATS subject.
func stored(events []consumer.Event) []consumer.Event {
	out := make([]consumer.Event, 0, len(events))
	for _, e := range events {
		e.Sequence, e.NATSSubject = 0, ""
		out = append(out, e)
	}
	return out
}

func TestReplayOfTheArchiveReturnsWhatTheStreamDoes(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	newArchive(t, js)
	all := bothLayouts(t, js)
	waitArchived(t, js, len(all))
	for _, f := range []consumer.Filter{
		{},
		{Node: "node-1"},
		{Namespace: "default"},
		{Namespace: "payments", Type: "died"},
		{Type: "started"},
		{PodUID: all[1].PodUID},
		{PodUID: all[len(all)-1].PodUID, Type: "ContainerStarted"},
		{Namespace: "default", PodName: "web-2"},
	} {
		want := replayAll(t, js, consumer.Options{Filter: f})
		if len(want) == 0 {
			t.Fatalf("filter %+v selects nothing: not a test", f)
		}
		got := replayAll(t, js, consumer.Options{Filter: f, Archive: true})
		if diff := cmp.Diff(stored(want), stored(got)); diff != "" {
			t.Errorf("Replay of the archive with %+v (-stream +archive):\n%s", f, diff)
		}
		for _, e := range got {
			if tok := strings.Split(e.NATSSubject, "."); len(tok) != 5 || tok[3] != "%" {
				t.Errorf("archived event on %s, want a subject with %% for the pod UID", e.NATSSubject)
			}
		}
	}
}

// In the archive a legacy event's namespace is "%": the server cannot
// select it by namespace. With LegacyNever a namespace filter reads the
// current layout's events only, as on the stream.
func TestReplayOfTheArchiveWithLegacyNeverSkipsTheLegacyEventsOfANamespace(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	newArchive(t, js)
	all := bothLayouts(t, js)
	waitArchived(t, js, len(all))
	f := consumer.Filter{Namespace: "payments"}
	want := replayAll(t, js, consumer.Options{Filter: f, Legacy: consumer.LegacyNever})
	got := replayAll(t, js, consumer.Options{Filter: f, Legacy: consumer.LegacyNever, Archive: true})
	if diff := cmp.Diff(stored(want), stored(got)); diff != "" {
		t.Errorf("Replay of the archive (-stream +archive):\n%s", diff)
	}
	if len(got) == 0 || len(got) == len(only(all, f)) {
		t.Errorf("got %d events of %d in the namespace: want only the current layout's", len(got), len(only(all, f)))
	}
}

func TestArchiveFilterSubjects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f               consumer.Filter
		subject, legacy string
	}{
		{consumer.Filter{}, "pleg.>", ""},
		{consumer.Filter{PodUID: "u"}, "pleg.>", ""},
		{consumer.Filter{Node: "node-1", PodUID: "u"}, "pleg.node-1.>", ""},
		{consumer.Filter{Namespace: "shop"}, "pleg.*.shop.>", "pleg.*.%.%.*"},
		{consumer.Filter{Namespace: "shop", PodUID: "u", Type: "died"}, "pleg.*.shop.*.ContainerDied", "pleg.*.%.%.ContainerDied"},
		{consumer.Filter{Type: "removed"}, "pleg.*.*.*.ContainerRemoved", ""},
	} {
		subject, err := tc.f.ArchiveSubject("pleg")
		if err != nil {
			t.Fatal(err)
		}
		legacy, err := tc.f.ArchiveLegacySubject("pleg")
		if err != nil {
			t.Fatal(err)
		}
		if subject != tc.subject || legacy != tc.legacy {
			t.Errorf("filter %+v in the archive: %q and %q, want %q and %q", tc.f, subject, legacy, tc.subject, tc.legacy)
		}
	}
}
