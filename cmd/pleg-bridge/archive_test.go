package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/publish"
)

// TestReplayArchivePrintsWhatReplayOfTheStreamDoes: the archive, kept as a
// bridge with PLEG_ARCHIVE_MAX_AGE keeps it, holds the seeded events on
// subjects without the pod UID; replay --archive prints what replay of the
// stream prints, the pod filters checked on each event.
func TestReplayArchivePrintsWhatReplayOfTheStreamDoes(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	if _, err := publish.EnsureArchive(t.Context(), env.js, publish.ArchiveOptions{Stream: testStream, SubjectPrefix: testPrefix, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	env.seed(t)
	waitStreamMsgs(t, env.js, testStream+"_ARCHIVE", 5)
	for _, args := range [][]string{
		{"--pod", "aaaa-1111"},
		{"--pod", "default/web-0"},
		{"--namespace", "kube-system"},
		{"-n", "default", "--type", "Died"},
		{"--node", "node-2.example.com"},
		{"--node", "node-1", "--type", "ContainerRemoved"},
		{"--since", "1h"},
		{"--pod", "no-such-pod"},
	} {
		want := replay(t, env, args...)
		got := replay(t, env, append(args, "--archive")...)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("replay %s --archive printed (-stream +archive):\n%s", strings.Join(args, " "), diff)
		}
	}
}

func TestReplayArchiveNamesTheMissingArchive(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	var out, errs strings.Builder
	err := run(t.Context(), []string{"replay", "--archive", "--since", "1h"}, env.lookup, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "archive stream EVENTS_ARCHIVE not found") || !strings.Contains(err.Error(), "PLEG_ARCHIVE_MAX_AGE") {
		t.Errorf("replay --archive without an archive: %v", err)
	}
}

// waitStreamMsgs waits until stream holds n messages, reading them.
func waitStreamMsgs(t *testing.T, js jetstream.JetStream, stream string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < n; {
		batch, err := cons.Fetch(n-got, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range batch.Messages() {
			got++
		}
		if ctx.Err() != nil {
			t.Fatalf("%s holds %d messages, want %d", stream, got, n)
		}
	}
}

func TestTailArchiveFollowsTheArchive(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	if _, err := publish.EnsureArchive(t.Context(), env.js, publish.ArchiveOptions{Stream: testStream, SubjectPrefix: testPrefix, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	env.seed(t)
	waitStreamMsgs(t, env.js, testStream+"_ARCHIVE", 5)
	want := readLines(t, startTail(t, env, "--all", "--pod", "default/web-0").lines, 3)
	got := readLines(t, startTail(t, env, "--all", "--archive", "--pod", "default/web-0").lines, 3)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tail --all --archive --pod default/web-0 printed (-stream +archive):\n%s", diff)
	}
}
