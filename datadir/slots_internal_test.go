package datadir

import (
	"encoding/binary"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

var slotT0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func slotEvent(id string, typ generator.LifecycleEventType, at time.Time) generator.Event {
	ev := generator.Event{Type: typ, Pod: generator.Pod{UID: "u-" + id, Namespace: "shop", Name: "web"},
		Container: generator.Container{ID: id, Name: "app", Image: "nginx:1.27"}, State: generator.StateRunning,
		StartedAt: slotT0, Time: at, ObservedAt: at}
	if typ == generator.ContainerRemoved {
		ev.State = generator.StateRemoved
	}
	return ev
}

// fileKeys returns the containers of the checkpoint's keys in key order,
// each once, checking that every key is its record's (keySlot).
func fileKeys(t *testing.T, path string) []string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ids []string
	err = db.View(func(tx *bolt.Tx) error {
		if v := string(tx.Bucket([]byte(bucketMeta)).Get([]byte(keyVersion))); v != FormatVersion {
			t.Errorf("format version %q, want %q", v, FormatVersion)
		}
		return tx.Bucket([]byte(bucketCheckpoint)).ForEach(func(k, v []byte) error {
			r, err := decodeRecord(v)
			if err != nil {
				return err
			}
			if _, ok := keySlot(k, r.ID); !ok {
				t.Errorf("key %q is not container %s's", k, r.ID)
			}
			if len(ids) == 0 || ids[len(ids)-1] != r.ID {
				ids = append(ids, r.ID)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestCheckpointKeysFollowTheFirstAck: a container's records are keyed
// after those of every container acked before it, whatever its ID, and a
// reopened store goes on after the highest: under churn, a write changes
// the last pages of the file only.
func TestCheckpointKeysFollowTheFirstAck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(dir, Options{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	first := []string{"f00", "a11", "c22"}
	for _, id := range first {
		s.Checkpoint().RecordAck(slotEvent(id, generator.ContainerStarted, slotT0), 0)
	}
	// A later ack of an earlier container stays with its first.
	s.Checkpoint().RecordAck(slotEvent("f00", generator.ContainerDied, slotT0), 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fileKeys(t, filepath.Join(dir, FileName)); !slices.Equal(got, first) {
		t.Fatalf("containers in key order %v, want %v", got, first)
	}

	s, err = Open(dir, Options{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	s.Checkpoint().RecordAck(slotEvent("000", generator.ContainerStarted, slotT0), 0)
	s.Checkpoint().RecordAck(slotEvent("a11", generator.ContainerRemoved, time.Now()), 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(first), "000")
	if got := fileKeys(t, filepath.Join(dir, FileName)); !slices.Equal(got, want) {
		t.Fatalf("after a reopen: containers in key order %v, want %v", got, want)
	}
	s, err = Open(dir, Options{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := len(s.Checkpoint().Restored()); n != 6 {
		t.Errorf("restored %d records, want 6: %v", n, s.Checkpoint().Restored())
	}
}

// TestOpenRekeysAFormatV1Store: a store written by a bridge of format "1"
// (keys without slots) is rewritten at Open: every record is restored,
// its spool's delivered entries are still recognised by their acks, and
// removed containers are still collected after their time.
func TestOpenRekeysAFormatV1Store(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	old := slotT0.Add(-keepRemoved - time.Hour)
	acked := []generator.Event{
		slotEvent("b", generator.ContainerStarted, slotT0),
		slotEvent("b", generator.ContainerDied, slotT0),
		slotEvent("a", generator.ContainerStarted, slotT0),
		slotEvent("gone", generator.ContainerRemoved, old),
	}
	// Delivered (its ack is in the checkpoint), and not yet delivered.
	spooled := []generator.Event{acked[1], slotEvent("c", generator.ContainerStarted, slotT0)}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket([]byte(bucketMeta))
		if err != nil {
			return err
		}
		if err := meta.Put([]byte(keyVersion), []byte(formatV1)); err != nil {
			return err
		}
		if err := meta.Put([]byte(keyNode), []byte("node-1")); err != nil {
			return err
		}
		if err := meta.Put([]byte(keySequence), binary.BigEndian.AppendUint64(nil, 42)); err != nil {
			return err
		}
		// put writes ev's record into a new bucket under key(i, ev).
		put := func(bucket string, evs []generator.Event, key func(int, generator.Event) []byte) error {
			b, err := tx.CreateBucket([]byte(bucket))
			if err != nil {
				return err
			}
			for i, ev := range evs {
				data, err := encodeRecord(toRecord(ev))
				if err != nil {
					return err
				}
				if err := b.Put(key(i, ev), data); err != nil {
					return err
				}
			}
			return nil
		}
		if err := put(bucketCheckpoint, acked, func(_ int, ev generator.Event) []byte {
			return []byte(ev.Container.ID + "\x00" + string(ev.Type))
		}); err != nil {
			return err
		}
		return put(bucketSpool, spooled, func(i int, _ generator.Event) []byte { return seqKey(uint64(i + 1)) })
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := Open(dir, Options{Node: "node-1", SpoolMaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(evs []generator.Event) []string {
		var out []string
		for _, ev := range evs {
			out = append(out, ev.Container.ID+"/"+string(ev.Type))
		}
		slices.Sort(out)
		return out
	}
	// "gone" was removed longer ago than it is kept.
	if got, want := ids(s.Checkpoint().Restored()), ids(acked[:3]); !slices.Equal(got, want) {
		t.Errorf("restored %v, want %v", got, want)
	}
	if got := s.Checkpoint().Sequence(); got != 42 {
		t.Errorf("sequence %d, want 42", got)
	}
	if got, want := ids(s.Spool().Restored()), ids(spooled[1:]); !slices.Equal(got, want) {
		t.Errorf("spool restored %v, want %v (the delivered entry dropped)", got, want)
	}
	// The first write collects "gone", found by its new key.
	if err := s.flush(time.Now(), true); err != nil {
		t.Fatal(err)
	}
	s.Checkpoint().RecordAck(slotEvent("d", generator.ContainerStarted, slotT0), 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := fileKeys(t, path), []string{"a", "b", "d"}; !slices.Equal(got, want) {
		t.Errorf("containers in key order %v, want %v", got, want)
	}
}
