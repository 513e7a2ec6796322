package bridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// TestABridgeWithAnArchiveCopiesEveryEventOnceWithoutThePodUID runs a
// bridge with PLEG_ARCHIVE_MAX_AGE's option: the archive holds every event
// of the stream exactly once, in the stream's order (so each pod's order),
// on subjects that carry the node, namespace and type but no pod UID.
func TestABridgeWithAnArchiveCopiesEveryEventOnceWithoutThePodUID(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	opts := testOptions(n.endpoint, n.url, t.TempDir())
	opts.Stream.MaxAge = time.Hour
	opts.Stream.ArchiveMaxAge = 7 * time.Hour
	opts.Version = "v9.8.7-test"
	opts.StateBucket = "PLEG_STATE"
	for _, p := range []crisim.PodConfig{
		{Name: "web-0", Namespace: "shop", UID: "uid-1"},
		{Name: "web-1", Namespace: "shop", UID: "uid-2"},
		{Name: "db-0", Namespace: "data", UID: "uid-3"},
	} {
		sb, err := n.model.RunPodSandbox(p)
		if err != nil {
			t.Fatal(err)
		}
		n.startContainer(t, sb, "app")
	}
	b, stop := runBridge(t, opts)
	live := fetchAll(t, n.js, "PLEG", 6)
	waitSettled(t, b)
	archived := fetchAll(t, n.js, "PLEG_ARCHIVE", 6)
	stop()
	checkLines(t, archived, live)

	if got := streamMsgs(t, n.js, "PLEG_ARCHIVE"); got != 6 {
		t.Errorf("the archive holds %d events, want 6", got)
	}
	s, err := n.js.Stream(t.Context(), "PLEG_ARCHIVE")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{
		"pleg.node-1.shop.%.ContainerStarted": 4,
		"pleg.node-1.data.%.ContainerStarted": 2,
	}
	if len(info.State.Subjects) != len(want) {
		t.Errorf("archive subjects %v, want %v", info.State.Subjects, want)
	}
	for subj, count := range want {
		if info.State.Subjects[subj] != count {
			t.Errorf("archive subject %s holds %d, want %d (all: %v)", subj, info.State.Subjects[subj], count, info.State.Subjects)
		}
	}
	if info.Config.MaxAge != 7*time.Hour || info.Config.Replicas != 1 {
		t.Errorf("archive max age %s, replicas %d; want 7h, 1", info.Config.MaxAge, info.Config.Replicas)
	}
	// The stream, the archive and the state bucket say which bridge made
	// them.
	for _, name := range []string{"PLEG", "PLEG_ARCHIVE", "KV_PLEG_STATE"} {
		s, err := n.js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		md := s.CachedInfo().Config.Metadata
		if md[schemas.MetadataVersion] != opts.Version || md[schemas.MetadataContractVersion] != schemas.ContractVersion {
			t.Errorf("stream %s metadata %v: want version %s, contract %s", name, md, opts.Version, schemas.ContractVersion)
		}
	}

	// The events decode from the body: the archive's subjects lose nothing.
	cons, err := n.js.OrderedConsumer(t.Context(), "PLEG_ARCHIVE", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e, err := consumer.DecodeMsg(msg)
	if err != nil || !strings.HasPrefix(e.PodUID, "uid-") || e.Node != "node-1" {
		t.Errorf("first archived event: pod UID %q, node %q, err %v", e.PodUID, e.Node, err)
	}
}
