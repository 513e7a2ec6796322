package publish_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

func TestEnsureArchiveCopiesEveryEventOncePerNodeNamespaceAndType(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()

	if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg", MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Events stored before the archive exists are archived too.
	types := []string{"ContainerStarted", "ContainerDied", "ContainerRemoved"}
	var want []string // "<archived subject> <body>", in stream order
	publishOne := func(subject, archived, body string) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte(body), Header: nats.Header{"Nats-Msg-Id": {body}}}); err != nil {
			t.Fatal(err)
		}
		want = append(want, archived+" "+body)
	}
	round := func(r int) {
		for p := range 6 {
			uid := fmt.Sprintf("0000000%d-0000-4000-8000-000000000000", p)
			node, ns := fmt.Sprintf("node-%d", p%2), fmt.Sprintf("team-%d", p%3)
			for _, typ := range types {
				body := fmt.Sprintf("%s %d %s", uid, r, typ)
				publishOne(schemas.Subject("pleg", node, ns, uid, typ), "pleg."+node+"."+ns+".%."+typ, body)
			}
			body := fmt.Sprintf("%s %d legacy", uid, r)
			publishOne(schemas.LegacySubject("pleg", node, uid, "ContainerDied"), "pleg."+node+".%.%.ContainerDied", body)
		}
	}
	round(0)
	a, err := publish.EnsureArchive(ctx, js, publish.ArchiveOptions{SubjectPrefix: "pleg", MaxAge: 7 * time.Hour})
	if err != nil {
		t.Fatalf("EnsureArchive: %v", err)
	}
	round(1)

	var got []string
	for _, m := range publishtest.ReadStream(t, js, "PLEG_ARCHIVE", len(want)) {
		got = append(got, m.Subject()+" "+string(m.Data()))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("archived messages, in order (-want +got):\n%s", diff)
	}
	info, err := a.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	// Pod p is on node p%2 in namespace p%3: 6 node-namespace pairs × 3
	// types, plus the 2 nodes' legacy ContainerDied.
	if n := len(info.State.Subjects); n != 6*3+2 {
		t.Errorf("archive holds %d subjects, want %d: %v", n, 6*3+2, info.State.Subjects)
	}
	if info.State.Msgs != uint64(len(want)) {
		t.Errorf("archive holds %d messages, want %d", info.State.Msgs, len(want))
	}
	if info.Config.MaxAge != 7*time.Hour || len(info.Config.Subjects) != 0 || info.Config.Storage != jetstream.FileStorage {
		t.Errorf("archive config: max age %s, subjects %v, storage %s", info.Config.MaxAge, info.Config.Subjects, info.Config.Storage)
	}
	parts, err := schemas.ParseSubject("pleg", "pleg.node-1.team-0.%.ContainerDied")
	if err != nil || parts.PodUID != "" || parts.Namespace != "team-0" {
		t.Errorf("ParseSubject of an archived subject = %+v, %v; want an empty pod UID", parts, err)
	}

	// A second call finds it; a new max age is applied, the source kept.
	again, err := publish.EnsureArchive(ctx, js, publish.ArchiveOptions{SubjectPrefix: "pleg", MaxAge: 8 * time.Hour})
	if err != nil {
		t.Fatalf("EnsureArchive on an existing archive: %v", err)
	}
	if c := again.CachedInfo(); c.Created != info.Created || c.Config.MaxAge != 8*time.Hour {
		t.Errorf("archive after a second EnsureArchive: created %v (was %v), max age %s", c.Created, info.Created, c.Config.MaxAge)
	}
}

func TestEnsureArchiveRefusesAStreamWithoutTheSource(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLEG_ARCHIVE", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err := publish.EnsureArchive(ctx, js, publish.ArchiveOptions{SubjectPrefix: "pleg", MaxAge: time.Hour})
	if err == nil || !strings.Contains(err.Error(), "PLEG_ARCHIVE") || !strings.Contains(err.Error(), "no source from stream PLEG") {
		t.Errorf("EnsureArchive on a stream without the source: %v", err)
	}
}

func TestEnsureArchiveRejectsBadOptions(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	for name, opts := range map[string]publish.ArchiveOptions{
		"a negative max age":    {SubjectPrefix: "pleg", MaxAge: -time.Hour},
		"the event stream name": {SubjectPrefix: "pleg", Name: "PLEG"},
		"a bad prefix":          {SubjectPrefix: "pleg.>"},
	} {
		if _, err := publish.EnsureArchive(t.Context(), js, opts); err == nil {
			t.Errorf("EnsureArchive with %s: no error", name)
		}
	}
}

// An archive created beside a stream whose first messages are gone (aged
// out or purged) starts at the stream's first message: start sequence 1 is
// below it, and the server begins at what it has.
func TestEnsureArchiveBesideAStreamThatLostItsFirstMessagesCopiesTheRest(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	s, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	publishN := func(from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			subject := schemas.Subject("pleg", "node-1", "shop", fmt.Sprintf("uid-%d", i), "ContainerStarted")
			if _, err := js.Publish(ctx, subject, []byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publishN(0, 5)
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	publishN(5, 3)
	if _, err := publish.EnsureArchive(ctx, js, publish.ArchiveOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range publishtest.ReadStream(t, js, "PLEG_ARCHIVE", 3) {
		got = append(got, string(m.Data()))
	}
	if diff := cmp.Diff([]string{"5", "6", "7"}, got); diff != "" {
		t.Errorf("archived (-want +got):\n%s", diff)
	}
}
