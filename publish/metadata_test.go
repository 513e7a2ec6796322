package publish_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// levelMsgs returns each record's level and message.
func levelMsgs(recs []map[string]any) []string {
	var out []string
	for _, r := range recs {
		out = append(out, fmt.Sprint(r["level"], " ", r["msg"]))
	}
	return out
}

// ours returns the pleg-bridge keys of md.
func ours(md map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range []string{schemas.MetadataContractVersion, schemas.MetadataVersion} {
		if v, ok := md[k]; ok {
			out[k] = v
		}
	}
	return out
}

func metadataOf(t *testing.T, js jetstream.JetStream, stream string) map[string]string {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config.Metadata
}

func wantMetadata(version string) map[string]string {
	return map[string]string{schemas.MetadataContractVersion: schemas.ContractVersion, schemas.MetadataVersion: version}
}

func checkMetadata(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if g := ours(got); len(g) != len(want) || g[schemas.MetadataContractVersion] != want[schemas.MetadataContractVersion] ||
		g[schemas.MetadataVersion] != want[schemas.MetadataVersion] {
		t.Errorf("%s: metadata %v, want %v", what, got, want)
	}
}

func TestEnsureStreamAndArchiveRecordTheContractVersionTheyAreCreatedWith(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg", Version: "v1.4.0"}); err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
	checkMetadata(t, "stream", metadataOf(t, js, "PLEG"), wantMetadata("v1.4.0"))
	if _, err := publish.EnsureArchive(ctx, js, publish.ArchiveOptions{SubjectPrefix: "pleg", MaxAge: time.Hour, Version: "v1.4.0"}); err != nil {
		t.Fatalf("EnsureArchive: %v", err)
	}
	checkMetadata(t, "archive", metadataOf(t, js, "PLEG_ARCHIVE"), wantMetadata("v1.4.0"))
	// The state bucket's: statebucket.TestEnsureRecordsTheContractVersionItIsCreatedWith.

	// Without a version, the build's (a test binary has none).
	if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{Name: "OTHER", SubjectPrefix: "other"}); err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
	checkMetadata(t, "stream without a version", metadataOf(t, js, "OTHER"), wantMetadata("dev"))
}

// TestEnsureStreamRecordsTheContractVersionOncePerContract: a stream an
// older bridge made gets the metadata, beside the keys others put there,
// once; a later start of a bridge of the same contract, of another
// version, changes nothing (no updates in turn during a rollout), unless
// it updates the stream's limits, and then it records itself.
func TestEnsureStreamRecordsTheContractVersionOncePerContract(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	for _, name := range []string{"PLEG", "PLEG_ARCHIVE"} {
		cfg := jetstream.StreamConfig{Name: name, Subjects: []string{"pleg.>"}, Storage: jetstream.FileStorage,
			MaxAge: time.Hour, Duplicates: 2 * time.Minute, Metadata: map[string]string{"team": "platform"}}
		if name == "PLEG_ARCHIVE" {
			cfg.Subjects = nil
			cfg.Sources = []*jetstream.StreamSource{{Name: "PLEG", OptStartSeq: 1, SubjectTransforms: publish.ArchiveTransforms("pleg")}}
		}
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	ensure := func(version string, maxAge time.Duration) []string {
		t.Helper()
		var logs logtest.Buffer
		if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg", MaxAge: maxAge,
			Version: version, Logger: logs.JSONLogger(slog.LevelDebug)}); err != nil {
			t.Fatalf("EnsureStream: %v", err)
		}
		if _, err := publish.EnsureArchive(ctx, js, publish.ArchiveOptions{SubjectPrefix: "pleg", MaxAge: maxAge,
			Version: version, Logger: logs.JSONLogger(slog.LevelDebug)}); err != nil {
			t.Fatalf("EnsureArchive: %v", err)
		}
		return levelMsgs(logs.TakeRecords(t, ""))
	}

	got := ensure("v1.4.0", time.Hour)
	want := []string{"INFO recorded the contract version in the stream's metadata", "INFO recorded the contract version in the archive's metadata"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("first start logged %q, want %q", got, want)
	}
	for _, name := range []string{"PLEG", "PLEG_ARCHIVE"} {
		md := metadataOf(t, js, name)
		checkMetadata(t, name, md, wantMetadata("v1.4.0"))
		if md["team"] != "platform" {
			t.Errorf("%s: the operator's key is gone: %v", name, md)
		}
	}

	for range 3 {
		if got := ensure("v1.5.0", time.Hour); len(got) != 0 {
			t.Errorf("a start of the same contract logged %q, want nothing", got)
		}
		checkMetadata(t, "PLEG after a start of another version", metadataOf(t, js, "PLEG"), wantMetadata("v1.4.0"))
	}

	got = ensure("v1.5.0", 2*time.Hour)
	if want := []string{"INFO updated stream", "INFO updated archive"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("a start with a new max age logged %q, want %q", got, want)
	}
	for _, name := range []string{"PLEG", "PLEG_ARCHIVE"} {
		md := metadataOf(t, js, name)
		checkMetadata(t, name+" after its limits changed", md, wantMetadata("v1.5.0"))
		if md["team"] != "platform" {
			t.Errorf("%s: the operator's key is gone: %v", name, md)
		}
	}
}

// TestEnsureStreamKeepsTheMetadataOfANewerContract: after a downgrade, the
// older bridge does not record its older contract over the newer one's,
// and says so.
func TestEnsureStreamKeepsTheMetadataOfANewerContract(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	newer := map[string]string{schemas.MetadataContractVersion: "99", schemas.MetadataVersion: "v9.0.0"}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLEG", Subjects: []string{"pleg.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, Metadata: newer}); err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg", Version: "v1.4.0", Logger: logs.JSONLogger(slog.LevelDebug)}); err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
	if got, want := levelMsgs(logs.TakeRecords(t, "")), []string{"WARN the stream was set up by a bridge of a newer contract version; this bridge publishes its own"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged %q, want %q", got, want)
	}
	if got := ours(metadataOf(t, js, "PLEG")); got[schemas.MetadataContractVersion] != "99" || got[schemas.MetadataVersion] != "v9.0.0" {
		t.Errorf("metadata %v, want the newer bridge's %v kept", got, newer)
	}
}

// TestEnsureStreamGoesOnWithoutTheRightToRecordItsContract: a bridge whose
// user may create the stream but not update it starts against a stream an
// older bridge made, within the bound of one metadata update, and warns.
func TestEnsureStreamGoesOnWithoutTheRightToRecordItsContract(t *testing.T) {
	t.Parallel()
	s := publishtest.RunServer(t, &server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "bridge", Password: "bridge", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"pleg.>", "$JS.API.INFO",
					"$JS.API.STREAM.INFO.PLEG", "$JS.API.STREAM.CREATE.PLEG"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		},
	})
	_, admin := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("admin", "admin"))
	ctx := t.Context()
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "PLEG", Subjects: []string{"pleg.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, js := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("bridge", "bridge"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))

	var logs logtest.Buffer
	start := time.Now()
	if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg", Version: "v1.4.0", Logger: logs.JSONLogger(slog.LevelDebug)}); err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("EnsureStream took %v", d)
	}
	if got, want := levelMsgs(logs.TakeRecords(t, "")), []string{"WARN cannot record the contract version in the stream's metadata; going on without"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged %q, want %q", got, want)
	}
	if md := ours(metadataOf(t, admin, "PLEG")); len(md) != 0 {
		t.Errorf("metadata %v recorded without the right to update", md)
	}
}
