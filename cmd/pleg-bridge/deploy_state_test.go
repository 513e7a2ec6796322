package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/statebucket"
	"github.com/pleg-bridge/pleg-bridge/statebucket/statebuckettest"
)

// TestNATSAccountsLetTheBridgeKeepAndTheReaderWatchTheStateBucket runs
// accounts.conf in a real server: the bridge user creates the state
// bucket, writes and deletes keys and reads its node's keys back to
// reconcile them; the reader lists and watches the bucket as ps does,
// and cannot write it; neither can delete or purge the bucket.
func TestNATSAccountsLetTheBridgeKeepAndTheReaderWatchTheStateBucket(t *testing.T) {
	u := newNATSUsers(t)
	connect := startAccountsServer(t)
	_, jsB, _ := connect(u.bridge)
	ncR, jsR, errsR := connect(u.reader)

	// The bridge's writer: it creates the bucket, writes two containers,
	// deletes one, and reconciles (Ready at once), which reads its keys.
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Buffer{}
	stateOpts := statebucket.Options{
		Bucket: schemas.DefaultStateBucket, Encoder: enc, Manage: true, Ready: func() bool { return true },
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	}
	if _, err := statebucket.Ensure(t.Context(), jsB, stateOpts); err != nil {
		t.Fatalf("the bridge user cannot create the state bucket: %v", err)
	}
	w := statebuckettest.Start(t, jsB, stateOpts)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, e := range []struct {
		typ generator.LifecycleEventType
		id  string
	}{{generator.ContainerStarted, "a"}, {generator.ContainerStarted, "b"}, {generator.ContainerDied, "b"}, {generator.ContainerRemoved, "b"}} {
		w.Record(generator.Event{
			Type: e.typ, Pod: generator.Pod{UID: "u1", Namespace: "shop", Name: "web-0"},
			Container: generator.Container{ID: e.id, Name: e.id}, State: generator.StateRunning,
			Time: at, ObservedAt: at, DetectedBy: generator.SourceRelist,
		})
	}

	// The reader follows the bucket as ps --watch does until it holds a
	// alone: the writes and the delete went through.
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	keys := map[string]bool{}
	var synced bool
	err = consumer.WatchState(wctx, jsR, consumer.StateOptions{}, func(ch consumer.StateChange) error {
		switch ch.Op {
		case consumer.StateSynced:
			synced = true
		case consumer.StateRemoved:
			delete(keys, ch.Container.Ref.ContainerID)
		default:
			keys[ch.Container.Ref.ContainerID] = true
		}
		if synced && len(keys) == 1 && keys["a"] {
			wcancel()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the reader cannot watch the state bucket: %v\nbridge's writer:\n%s", err, logs.String())
	}
	if !synced || len(keys) != 1 || !keys["a"] {
		t.Fatalf("the reader sees containers %v, want only a\nbridge's writer:\n%s", keys, logs.String())
	}
	// The reconcile ran before the writes (Ready from the start): it read
	// the node's keys through its own consumer.
	if l := logs.String(); !strings.Contains(l, "reconciled the node's keys") || strings.Contains(l, "cannot") {
		t.Errorf("the bridge's writer did not reconcile, or failed:\n%s", l)
	}
	// The reader can see a alone before the purge of b, which the writer
	// may have folded into one write with b's start, is done.
	waittest.Until(t, 10*time.Second, "the bridge's writer to have no key pending", func() (bool, error) {
		n := w.Pending()
		return n == 0, fmt.Errorf("%d keys pending\n%s", n, logs.String())
	})

	// The reader gets a key directly, and cannot write, delete or purge.
	kvR, err := jsR.KeyValue(t.Context(), schemas.DefaultStateBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := schemas.StateKey(schemas.StateRef{Node: "node-1", Namespace: "shop", Pod: "web-0", PodUID: "u1", ContainerID: "a"})
	if _, err := kvR.Get(t.Context(), key); err != nil {
		t.Errorf("the reader cannot get a key: %v", err)
	}
	for _, subject := range []string{"$KV." + schemas.DefaultStateBucket + "." + key, "$JS.API.STREAM.PURGE.KV_" + schemas.DefaultStateBucket} {
		if err := ncR.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errsR:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("the reader publishing on %s: %v, want a permissions violation", subject, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the reader may publish on %s", subject)
		}
	}
	if err := jsB.DeleteKeyValue(t.Context(), schemas.DefaultStateBucket); err == nil {
		t.Error("the bridge may delete the state bucket")
	}
}
