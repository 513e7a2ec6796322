package publish_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

func TestEnsureStreamCreatesAMissingStream(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()

	s, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg", MaxAge: time.Hour})
	if err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := info.Config
	want := jetstream.StreamConfig{
		Name:       "PLEG",
		Subjects:   []string{"pleg.>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     time.Hour,
		Duplicates: 2 * time.Minute,
		Replicas:   1,
	}
	if diff := cmp.Diff(want, jetstream.StreamConfig{
		Name: got.Name, Subjects: got.Subjects, Storage: got.Storage, Retention: got.Retention,
		MaxAge: got.MaxAge, Duplicates: got.Duplicates, Replicas: got.Replicas,
	}); diff != "" {
		t.Errorf("stream config (-want +got):\n%s", diff)
	}

	// A second call finds it and changes nothing.
	again, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg", MaxAge: time.Hour})
	if err != nil {
		t.Fatalf("EnsureStream on an existing stream: %v", err)
	}
	if again.CachedInfo().Created != info.Created {
		t.Errorf("stream was recreated: created %v, then %v", info.Created, again.CachedInfo().Created)
	}
}

func TestEnsureStreamUpdatesMaxAgeAndDuplicateWindowOfAnExistingStream(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"k8s.>"}, Storage: jetstream.MemoryStorage,
		MaxAge: time.Hour, Duplicates: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}

	s, err := publish.EnsureStream(ctx, js, publish.StreamOptions{
		Name: "EVENTS", SubjectPrefix: "k8s.pleg", MaxAge: 2 * time.Hour, DuplicateWindow: 5 * time.Minute,
	})
	if err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != 2*time.Hour || info.Config.Duplicates != 5*time.Minute {
		t.Errorf("max age %s, duplicate window %s; want 2h, 5m", info.Config.MaxAge, info.Config.Duplicates)
	}
	// What the operator chose and the bridge does not manage stays.
	if info.Config.Storage != jetstream.MemoryStorage || !cmp.Equal(info.Config.Subjects, []string{"k8s.>"}) {
		t.Errorf("storage %v, subjects %v; want memory and [k8s.>] untouched", info.Config.Storage, info.Config.Subjects)
	}
}

func TestEnsureStreamRefusesAStreamThatDoesNotCoverThePrefix(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLEG", Subjects: []string{"pleg.*.*.ContainerDied", "orders.>"}}); err != nil {
		t.Fatal(err)
	}

	_, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg"})
	if err == nil {
		t.Fatal("EnsureStream succeeded on a stream without pleg.>")
	}
	for _, want := range []string{"PLEG", "pleg.*.*.ContainerDied orders.>", "do not cover pleg.>"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	s, err := js.Stream(ctx, "PLEG")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Subjects; len(got) != 2 {
		t.Errorf("stream subjects were rewritten to %v", got)
	}
}

func TestEnsureStreamRejectsBadOptions(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	tests := []struct {
		name string
		opts publish.StreamOptions
		want string
	}{
		{"a wildcard prefix", publish.StreamOptions{SubjectPrefix: "pleg.>"}, `"pleg.>"`},
		{"negative replicas", publish.StreamOptions{SubjectPrefix: "pleg", Replicas: -1}, "replicas -1"},
		{"a negative max age", publish.StreamOptions{SubjectPrefix: "pleg", MaxAge: -time.Second}, "max age -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := publish.EnsureStream(context.Background(), js, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("EnsureStream(%+v) error = %v, want one containing %q", tt.opts, err, tt.want)
			}
		})
	}
}

func TestSubjectCovers(t *testing.T) {
	tests := []struct {
		filter, subject string
		want            bool
	}{
		{"pleg.>", "pleg.>", true},
		{">", "pleg.>", true},
		{"*.>", "pleg.>", true},
		{"k8s.>", "k8s.pleg.>", true},
		{"k8s.*.>", "k8s.pleg.>", true},
		{"pleg.*.*.*", "pleg.>", false},
		{"pleg", "pleg.>", false},
		{"pleg.node-1.>", "pleg.>", false},
		{"other.>", "pleg.>", false},
		{"k8s.pleg.>", "k8s.>", false},
		{"pleg.>", "pleg", false},
	}
	for _, tt := range tests {
		if got := publish.SubjectCovers(tt.filter, tt.subject); got != tt.want {
			t.Errorf("subjectCovers(%q, %q) = %v, want %v", tt.filter, tt.subject, got, tt.want)
		}
	}
}
