package datadir

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// StreamIdentity names one stream's history: the stream a checkpoint's
// acks came from. It is the stream's name and the time the server created
// it (jetstream.StreamInfo.Created).
//
// A stream deleted and created again under the same name, or one of the
// same name on another NATS server or cluster, has another creation time:
// its history is another, and what the checkpoint holds as published is
// not in it. A purged stream keeps its creation time and its sequence
// numbers (a purge does not reset them): it is the same history, of which
// the messages before the purge were deleted on purpose, as the stream's
// max age deletes them; the bridge publishes nothing again for it. A
// stream restored from a backup keeps its creation time too (nats-server
// restores it), and is told by its sequence instead: it ends before the
// checkpoint's sequence when the messages stored after the backup are
// lost. The server's or cluster's name is left out: renaming a cluster
// keeps its streams, and would look like another history.
type StreamIdentity struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
}

// IsZero reports whether id names no stream.
func (id StreamIdentity) IsZero() bool { return id.Name == "" && id.Created.IsZero() }

// Equal reports whether id and o name the same stream.
func (id StreamIdentity) Equal(o StreamIdentity) bool {
	return id.Name == o.Name && id.Created.Equal(o.Created)
}

// String returns "<name> created <time>", or "none" for the zero identity.
func (id StreamIdentity) String() string {
	if id.IsZero() {
		return "none"
	}
	return id.Name + " created " + id.Created.UTC().Format(time.RFC3339Nano)
}

// keyStream holds the identity of the stream the checkpoint belongs to
// (Checkpoint.Stream), as JSON; absent in stores written before it was,
// and in a fresh store until the publisher adopts its stream. The zero
// identity, written, means the checkpoint belongs to no stream: its
// history is being carried into a new one (Checkpoint.Disown).
const keyStream = "stream"

// streamChange is a change of the checkpoint's stream recorded and not yet
// written.
type streamChange struct {
	// id is the identity to write: zero after a Disown not followed by an
	// Adopt.
	id StreamIdentity
	// disown says a Disown came since the last write: the sequence written
	// is dropped before the new acks' is written.
	disown bool
}

// merge returns the change of c followed by the later change next.
func (c *streamChange) merge(next *streamChange) *streamChange {
	switch {
	case c == nil:
		return next
	case next == nil:
		return c
	}
	return &streamChange{id: next.id, disown: c.disown || next.disown}
}

// Stream returns the stream the checkpoint belonged to when the store was
// opened, and whether the store names one. A store written before the
// checkpoint named its stream, or a fresh one, names none: its publisher
// adopts the stream it finds if the stream covers the checkpoint's
// sequence. A store whose history was being carried into a new stream
// when its bridge stopped (see Disown) names the zero identity, which is
// no stream's.
func (c *Checkpoint) Stream() (StreamIdentity, bool) { return c.stream, c.streamKnown }

// Adopt records that the checkpoint belongs to the stream id from now on:
// the acks recorded so far, and their sequence, are that stream's. It is
// written by the Store's next write, in the transaction of the last acks
// recorded before the call, never before them. It does no I/O and is safe
// for concurrent use.
func (c *Checkpoint) Adopt(id StreamIdentity) {
	c.changeStream(&streamChange{id: id})
}

// Disown records that the checkpoint belongs to no stream any more: the
// stream it names is gone, or is another. The checkpoint's sequence, a
// position in that stream, is dropped; acks recorded after the call bring
// the new stream's, and Adopt names that stream once what the checkpoint
// holds is in it. Written by the Store's next write, the zero identity
// makes a bridge restarted before the Adopt carry the history into the
// new stream again, rather than take the checkpoint for the new stream's.
// It does no I/O and is safe for concurrent use.
func (c *Checkpoint) Disown() {
	c.changeStream(&streamChange{disown: true})
}

func (c *Checkpoint) changeStream(ch *streamChange) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch.disown {
		// The sequences recorded so far are the old stream's.
		c.seq = 0
		c.disowns++
	}
	c.streamChange = c.streamChange.merge(ch)
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// putStream writes ch in tx, after the acks and before the sequence of
// the transaction: a Disown deletes the sequence written (putSequence then
// writes the new stream's), and the identity is written.
func putStream(tx *bolt.Tx, ch *streamChange) error {
	if ch == nil {
		return nil
	}
	meta := tx.Bucket([]byte(bucketMeta))
	if ch.disown {
		if err := meta.Delete([]byte(keySequence)); err != nil {
			return fmt.Errorf("delete checkpoint sequence: %w", err)
		}
	}
	data, err := json.Marshal(ch.id)
	if err != nil {
		return fmt.Errorf("encode stream identity: %w", err)
	}
	if err := meta.Put([]byte(keyStream), data); err != nil {
		return fmt.Errorf("put stream identity: %w", err)
	}
	return nil
}

// readStream reads the stream identity from the meta bucket: ok false
// when none is written.
func readStream(meta *bolt.Bucket, path string) (id StreamIdentity, ok bool, err error) {
	v := meta.Get([]byte(keyStream))
	if v == nil {
		return id, false, nil
	}
	if err := json.Unmarshal(v, &id); err != nil {
		return id, false, corrupt(fmt.Errorf("%s holds a stream identity %q: %w", path, v, err))
	}
	return id, true, nil
}
