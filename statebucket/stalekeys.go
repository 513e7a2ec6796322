package statebucket

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// The node's stale keys: the writer holds the latest event of each of the
// node's containers, and the bucket should hold the same. When it cannot
// know that it does (at start, before the first write, and after it forgot
// deletes for want of room while NATS was away), the writer reads the
// node's keys back and rewrites those whose value differs from what it
// holds. The metric and the logs call that a reconcile of the node's keys
// (pleg_bridge_state_reconciles_total).

// markStaleKeysOrLog marks the node's stale keys dirty (markStaleKeys),
// logging a failure (at Warn the first after a success, at Debug the next
// ones); it reports success.
func (w *Writer) markStaleKeysOrLog(ctx context.Context, kv jetstream.KeyValue, failedBefore int) bool {
	n, err := w.markStaleKeys(ctx, kv)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case failedBefore == 0:
			w.log.Warn("cannot reconcile the node's keys in the state bucket, will try again", "err", err)
		default:
			w.log.Debug("cannot reconcile the node's keys in the state bucket, will try again", "err", err)
		}
		return false
	}
	w.metrics.reconciles.Inc()
	w.log.Info("reconciled the node's keys in the state bucket", "keys_to_write", n)
	return true
}

// markStaleKeys reads the node's keys and their values, and marks dirty
// every key whose value differs from what the writer holds (missing,
// stale, or of a container it does not hold). It returns how many it
// marked.
func (w *Writer) markStaleKeys(ctx context.Context, kv jetstream.KeyValue) (int, error) {
	w.mu.Lock()
	w.resync = false
	snapshot := make(map[string]generator.Event, len(w.live))
	for k, ev := range w.live {
		snapshot[k] = ev
	}
	w.mu.Unlock()

	stored, err := readKeys(ctx, kv, schemas.StateKeyFilter(schemas.StateRef{Node: w.node}))
	if err != nil {
		w.mu.Lock()
		w.resync = true
		w.mu.Unlock()
		return 0, err
	}
	var stale []string
	for key, value := range stored {
		ev, ok := snapshot[key]
		if !ok || storedEventID(value) != publish.EventID(ev.Container.ID, ev.Type) {
			stale = append(stale, key)
		}
	}
	for key := range snapshot {
		if _, ok := stored[key]; !ok {
			stale = append(stale, key)
		}
	}
	// A key whose container changed since the snapshot is dirty already
	// or written with its current value: marking it again costs at most
	// one write.
	w.mu.Lock()
	for _, key := range stale {
		w.markDirty(key, false)
	}
	w.mu.Unlock()
	if len(stale) > 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return len(stale), nil
}

// storedEventID returns the CloudEvent id of a stored value, "" if it has
// none. A key is up to date when it holds the writer's event: the id names
// the container and the event type, and nothing else. The bytes are not
// compared: a value written by a run whose events carried more (a field
// the checkpoint does not keep, which the writer's seed then lacks) is the
// same event and stays as it is.
func storedEventID(value []byte) string {
	var ce struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(value, &ce) != nil {
		return ""
	}
	return ce.ID
}

// readKeys returns the values of the keys of kv that match filter, deleted
// ones left out, as they are when it is called.
func readKeys(ctx context.Context, kv jetstream.KeyValue, filter string) (map[string][]byte, error) {
	rctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	watcher, err := kv.Watch(rctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer watcher.Stop()
	out := map[string][]byte{}
	for {
		select {
		case e, ok := <-watcher.Updates():
			if !ok {
				return nil, errors.New("read state keys: watcher stopped")
			}
			if e == nil {
				return out, nil
			}
			out[e.Key()] = e.Value()
		case <-rctx.Done():
			return nil, fmt.Errorf("read state keys: %w", rctx.Err())
		}
	}
}
