package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// StateOptions say which containers ListState and WatchState deliver. The
// zero value selects every container in the default bucket.
type StateOptions struct {
	// Bucket is the bridge's state bucket (PLEG_STATE_BUCKET),
	// schemas.DefaultStateBucket if empty.
	Bucket string
	Filter StateFilter
	// OnError, if set, is called with a *DecodeError for each entry that
	// is not a pleg-bridge container state; the entry is skipped either
	// way. It is called from the goroutine that called ListState or
	// WatchState.
	OnError func(error)
	// Repeats say whether WatchState drops an update that carries the
	// event the container's last change carried already (the same
	// CloudEvent id), as a bridge writes it again after the servers lost
	// it: Off delivers it, OnRepeat is called with each one dropped (the
	// Event's Sequence and FirstSequence are the entries' revisions).
	// Window and MaxIDs do not apply: the watcher keeps the last event id
	// of each container it follows until the container is removed, about
	// 80 bytes a container.
	Repeats RepeatOptions
}

// StateFilter selects containers by node, namespace and pod. An empty
// field matches anything. Every field is filtered on the server: the
// bucket's keys are <node>.<namespace>.<pod>.<podUID>.<containerID>
// (schemas.StateKey).
type StateFilter struct {
	Node      string
	Namespace string
	// Pod is the pod's name; it selects a pod only with Namespace set.
	Pod    string
	PodUID string
}

// Key returns the bucket's key filter that selects f's containers.
func (f StateFilter) Key() string {
	return schemas.StateKeyFilter(schemas.StateRef{Node: f.Node, Namespace: f.Namespace, Pod: f.Pod, PodUID: f.PodUID})
}

// ContainerState is one container of the current state: where its key
// says it is, and its latest event.
type ContainerState struct {
	// Key is the entry's key in the bucket, and Ref its decoded parts.
	Key string
	Ref schemas.StateRef
	// Event is the container's latest lifecycle event: a ContainerStarted
	// while it runs, a ContainerDied once it exited. It is zero in a
	// StateRemoved change.
	Event Event
	// Revision is the bucket's revision of the entry (its stream sequence),
	// and Stored when the bucket stored it.
	Revision uint64
	Stored   time.Time
}

// StateOp says what a StateChange is.
type StateOp int

const (
	// StateListed: a container of the state as it was when WatchState
	// started.
	StateListed StateOp = iota + 1
	// StateSynced: every container of the starting state was listed;
	// what follows are changes. The change carries no container.
	StateSynced
	// StateUpdated: a container was added or has a newer event.
	StateUpdated
	// StateRemoved: a container was removed (ContainerRemoved). Only Key
	// and Ref, Revision and Stored are set.
	StateRemoved
)

func (op StateOp) String() string {
	switch op {
	case StateListed:
		return "listed"
	case StateSynced:
		return "synced"
	case StateUpdated:
		return "updated"
	case StateRemoved:
		return "removed"
	}
	return fmt.Sprintf("StateOp(%d)", int(op))
}

// StateChange is what WatchState delivers: a container of the starting
// state, the end of it, or a change.
type StateChange struct {
	Op        StateOp
	Container ContainerState
}

// WatchState lists the current containers that match opts.Filter, then
// follows their changes, and calls fn for each, from the goroutine that
// called it: first one StateListed change per container, then one
// StateSynced, then StateUpdated and StateRemoved changes as the bridges
// write them. A container's changes come in the order of its events. An
// update that carries the event the container's last change carried (a
// bridge wrote it again after the servers lost it) is dropped, unless
// opts.Repeats.Off.
//
// It reads the bridges' state bucket with a key-value watcher, whose key
// filter the server applies, so a node's or a namespace's containers cost
// what they are, not the cluster. nats.go recreates the watcher's
// consumer after a reconnect or a gap and resumes after the last entry
// read; a container removed while a watcher was away longer than the
// bucket keeps delete markers (statebucket.DefaultMarkerTTL) is not
// reported removed.
//
// It blocks until ctx is done, then returns nil, or until fn returns an
// error, which it returns unchanged. An entry that does not decode is
// skipped and reported to opts.OnError. It returns an error if the bucket
// does not exist (is the bridge's PLEG_STATE_BUCKET set?) or the watcher
// stops.
func WatchState(ctx context.Context, js jetstream.JetStream, opts StateOptions, fn func(StateChange) error) error {
	err := watchState(ctx, js, opts, fn)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func watchState(ctx context.Context, js jetstream.JetStream, opts StateOptions, fn func(StateChange) error) error {
	bucket := cmp.Or(opts.Bucket, schemas.DefaultStateBucket)
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return fmt.Errorf("open state bucket %s: %w", bucket, err)
	}
	w, err := kv.Watch(ctx, opts.Filter.Key())
	if err != nil {
		return fmt.Errorf("watch state bucket %s: %w", bucket, err)
	}
	defer w.Stop()
	synced := false
	var seen map[idKey]lastChange
	if !opts.Repeats.Off {
		seen = make(map[idKey]lastChange)
	}
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return ctx.Err()
		case entry, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watch state bucket %s: the watcher stopped", bucket)
			}
			e = entry
		}
		if e == nil {
			if synced {
				continue
			}
			synced = true
			if err := fn(StateChange{Op: StateSynced}); err != nil {
				return err
			}
			continue
		}
		ch, ok := opts.change(e, synced)
		if !ok || opts.repeat(seen, ch) {
			continue
		}
		if err := fn(ch); err != nil {
			return err
		}
	}
}

// change decodes one entry of the watcher. ok is false for an entry to
// skip: one that does not decode, or the marker of a container removed
// before the watch started.
func (o StateOptions) change(e jetstream.KeyValueEntry, synced bool) (StateChange, bool) {
	c := ContainerState{Key: e.Key(), Revision: e.Revision(), Stored: e.Created()}
	ref, err := schemas.ParseStateKey(e.Key())
	if err != nil {
		o.reportError(e, err)
		return StateChange{}, false
	}
	c.Ref = ref
	if e.Operation() != jetstream.KeyValuePut {
		if !synced {
			return StateChange{}, false
		}
		return StateChange{Op: StateRemoved, Container: c}, true
	}
	ev, err := decodeState(e.Value())
	if err != nil {
		o.reportError(e, err)
		return StateChange{}, false
	}
	c.Event = ev
	op := StateUpdated
	if !synced {
		op = StateListed
	}
	return StateChange{Op: op, Container: c}, true
}

// lastChange is what WatchState delivered last for a container: its
// event's id and the entry's revision.
type lastChange struct {
	id       idKey
	revision uint64
}

// repeat reports whether ch repeats the last change delivered for its
// container, reporting it to Repeats.OnRepeat if so; else it records ch in
// seen (nil with Repeats.Off: nothing is a repeat). A removal is always
// delivered: a second one of a container already removed tells a reader
// nothing new but costs it nothing either, and keeping the removed
// containers would grow without bound.
func (o StateOptions) repeat(seen map[idKey]lastChange, ch StateChange) bool {
	if seen == nil {
		return false
	}
	k := keyOf(ch.Container.Key)
	if ch.Op == StateRemoved {
		delete(seen, k)
		return false
	}
	id := keyOf(ch.Container.Event.ID)
	if last, ok := seen[k]; ok && last.id == id {
		if o.Repeats.OnRepeat != nil {
			e := ch.Container.Event
			e.Sequence = ch.Container.Revision
			o.Repeats.OnRepeat(Repeat{Event: e, FirstSequence: last.revision})
		}
		return true
	}
	seen[k] = lastChange{id: id, revision: ch.Container.Revision}
	return false
}

func (o StateOptions) reportError(e jetstream.KeyValueEntry, err error) {
	if o.OnError != nil {
		o.OnError(&DecodeError{NATSSubject: "$KV." + e.Bucket() + "." + e.Key(), Sequence: e.Revision(), Err: err})
	}
}

// decodeState decodes a state entry's value: a structured CloudEvent.
func decodeState(value []byte) (Event, error) {
	ce, err := parseStructured(value)
	if err != nil {
		return Event{}, fmt.Errorf("decode container state: %w", err)
	}
	e, err := ce.event()
	if err != nil {
		return Event{}, fmt.Errorf("decode container state: %w", err)
	}
	return e, nil
}

// errListed ends the watch of ListState once the state is listed.
var errListed = errors.New("listed")

// ListState returns the current containers that match opts.Filter, sorted
// by key (node, namespace, pod, pod UID, container ID). It returns an error
// if the bucket does not exist or cannot be read before ctx ends.
func ListState(ctx context.Context, js jetstream.JetStream, opts StateOptions) ([]ContainerState, error) {
	var out []ContainerState
	err := watchState(ctx, js, opts, func(ch StateChange) error {
		if ch.Op == StateSynced {
			return errListed
		}
		out = append(out, ch.Container)
		return nil
	})
	if !errors.Is(err, errListed) {
		return nil, err
	}
	slices.SortFunc(out, func(a, b ContainerState) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}
