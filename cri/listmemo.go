package cri

import (
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// listMemo remembers the items of the last full listing (no filter) by ID,
// with the state and creation time they were listed in, so that the next
// listing decodes only the items that changed: an item listed again with
// the same ID, state and creation time is the remembered one.
//
// Why: a steady relist lists every container and sandbox of the node again,
// and almost none has changed. Decoding each anew (its metadata, image and
// labels) was most of a steady relist's CPU in the bridge and of the bytes
// it allocated, which makes the evented mode's safety-net relist its idle
// cost (BenchmarkListDecode's steady case, pleg-bench's idle rows; see
// BENCHMARKS.md). What the generator reads of an item besides its state is
// fixed when the runtime creates it (CRI has no call that changes a
// container's or a sandbox's metadata, image, labels or annotations), and
// the creation time tells a recreated ID apart.
//
// A full listing replaces the memo with what it listed, so an item that is
// gone is forgotten by the next one; a filtered listing (a targeted relist
// of one sandbox) reads it and leaves it. A listing that fails leaves it as
// it was. Nothing is remembered until the memo is armed
// (Client.ReuseListings): the bridge arms it once its first relist's
// events are acked, so that the memo does not keep that relist's items
// alive through its memory peak (every container's status is read and its
// event published after it). The memo holds about 1 KB a container of a
// kubelet's node (5 MB at 1,000 pods and 5,000 containers), most of it the
// sandboxes' label maps. Items are read-only, as those of one listing are
// (see Client), so sharing them between listings is safe. Safe for
// concurrent use.
type listMemo[T any] struct {
	mu    sync.Mutex
	armed bool
	items map[string]memoItem[T] // replaced whole, never modified once set
}

type memoItem[T any] struct {
	key  itemKey
	item T
	idx  int32 // unique in its map, below its size: a listing marks it seen
}

// itemKey is what tells a listed item changed: its state and creation time.
type itemKey struct {
	state     int32
	createdAt int64
}

// snapshot returns the remembered items (nil if none), which are read
// without the lock (a map is never modified once it is the memo's), and
// whether the memo is armed.
func (m *listMemo[T]) snapshot() (map[string]memoItem[T], bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.items, m.armed
}

// arm makes full listings fill the memo from now on.
func (m *listMemo[T]) arm() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.armed = true
}

// replace makes items, the complete result of a full listing begun once
// the memo was armed, the memo.
func (m *listMemo[T]) replace(items map[string]memoItem[T]) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.items = items
}

// listingMemo reads listed items through a memo, for one listing: the
// items it finds unchanged come from the memo, the others are decoded. A
// full listing of an armed memo then makes the memo what it listed, unless
// it listed exactly what the memo held (the same items, each once): the
// memo stays as it is, and the listing built nothing.
//
// Why build nothing: a full relist lists the node again and again, and on
// a quiet node a map of what it listed, made anew each time, was most of
// what a steady relist allocated once its items came from the memo (1 MiB
// at 1,000 pods and 5,000 containers, pleg-bench's relist rows), garbage
// that the collector then marked the whole cache for.
type listingMemo[T any] struct {
	memo *listMemo[T] // nil: no memo, every item is decoded
	key  func(b []byte) (id []byte, k itemKey, err error)
	// keyOf is key of a decoded item: the memo a full listing makes is
	// built from what it listed.
	keyOf func(T) (id string, k itemKey)
	full  bool
	fill  bool // a full listing of an armed memo: it replaces the memo
	old   map[string]memoItem[T]
	seen  []uint64 // a bit per item of old, by idx: listed
	twice bool     // an item of old was listed twice
	// decoded and reused count the listing's items into counts, if set.
	decoded, reused uint64
	counts          *listCounts
}

// beginListing starts a listing through m (nil: no memo), whose items key
// and keyOf identify.
func beginListing[T any](m *listMemo[T], full bool, key func([]byte) ([]byte, itemKey, error), keyOf func(T) (string, itemKey), counts *listCounts) *listingMemo[T] {
	l := &listingMemo[T]{memo: m, key: key, keyOf: keyOf, full: full, counts: counts}
	if m == nil {
		return l
	}
	old, armed := m.snapshot()
	l.old = old
	l.fill = armed && full
	if l.fill && old != nil {
		// Only a listing that may replace the memo asks whether it listed
		// exactly what the memo holds: a targeted relist's does not.
		l.seen = make([]uint64, (len(old)+63)/64)
	}
	return l
}

// item returns the item whose wire form is b: the remembered one if it was
// listed with the same ID and key, else decode(b). Without a memo to read
// it only decodes: nothing to look the key up for.
func (l *listingMemo[T]) item(b []byte, decode func([]byte) (T, error)) (T, error) {
	if l.old == nil {
		l.decoded++
		return decode(b)
	}
	id, k, err := l.key(b)
	if err != nil {
		var zero T
		return zero, err
	}
	if e, ok := l.old[string(id)]; ok && e.key == k {
		if l.seen != nil {
			word, bit := e.idx/64, uint64(1)<<(e.idx%64)
			l.twice = l.twice || l.seen[word]&bit != 0
			l.seen[word] |= bit
		}
		l.reused++
		return e.item, nil
	}
	l.decoded++
	return decode(b)
}

// end ends a listing that listed items and counts them. One that read every
// item without error (ok) and fills the memo replaces it with items, unless
// they are what it held. A full listing that did not list exactly what the
// memo held (or that had no armed memo to compare with) counts a change.
func (l *listingMemo[T]) end(ok bool, items []T) {
	// Every item of old listed once, and nothing else: the same set.
	same := ok && l.fill && l.old != nil && l.decoded == 0 && !l.twice && l.reused == uint64(len(l.old))
	if ok && l.fill && !same {
		l.memo.replace(memoOf(items, l.keyOf))
	}
	if l.counts != nil {
		l.counts.decoded.Add(l.decoded)
		l.counts.reused.Add(l.reused)
		if l.full && !same {
			l.counts.changes.Add(1)
		}
	}
}

// memoOf makes the memo of a full listing's items. An ID listed twice
// keeps the last, as protobuf merges a field sent twice; an item without
// an ID is not remembered.
func memoOf[T any](items []T, keyOf func(T) (string, itemKey)) map[string]memoItem[T] {
	m := make(map[string]memoItem[T], len(items))
	for _, it := range items {
		id, k := keyOf(it)
		if id == "" {
			continue
		}
		e, ok := m[id]
		if !ok {
			e.idx = int32(len(m))
		}
		e.key, e.item = k, it
		m[id] = e
	}
	return m
}

// readListing appends the items of listing data to *into, each read through
// l (decoded by decode where it must be), and ends l. what names an item
// in errors.
func readListing[T any](data mem.BufferSlice, into *[]T, what string, l *listingMemo[T], decode func([]byte) (T, error)) error {
	err := eachItem(data, func(b []byte) error {
		v, err := l.item(b, decode)
		if err != nil {
			return fmt.Errorf("decode %s %d: %w", what, len(*into), err)
		}
		*into = append(*into, v)
		return nil
	})
	l.end(err == nil, *into)
	return err
}

// listCounts count the items the listings decoded and took from a memo,
// and the full listings that changed what a memo holds (see
// listMemos.version).
type listCounts struct{ decoded, reused, changes atomic.Uint64 }

// listMemos are the CRI client's memos of its two listings.
type listMemos struct {
	containers listMemo[*runtimeapi.Container]
	sandboxes  listMemo[*runtimeapi.PodSandbox]
	counts     listCounts
}

func (m *listMemos) arm() {
	m.containers.arm()
	m.sandboxes.arm()
}

// version returns a number that stays the same for as long as every full
// listing lists exactly what the one before it did (the same items, by ID,
// state and creation time), and whether the memos are armed: before, no
// listing is compared, and the number means nothing. A full listing that
// differs, fails or finds no memo to compare with changes it.
func (m *listMemos) version() (uint64, bool) {
	_, armed := m.containers.snapshot()
	return m.counts.changes.Load(), armed
}

// containerListing starts a container listing through m (nil: no memo).
func (m *listMemos) containerListing(full bool) *listingMemo[*runtimeapi.Container] {
	if m == nil {
		return beginListing(nil, full, containerKey, containerKeyOf, nil)
	}
	return beginListing(&m.containers, full, containerKey, containerKeyOf, &m.counts)
}

// sandboxListing is containerListing for a sandbox listing.
func (m *listMemos) sandboxListing(full bool) *listingMemo[*runtimeapi.PodSandbox] {
	if m == nil {
		return beginListing(nil, full, sandboxKey, sandboxKeyOf, nil)
	}
	return beginListing(&m.sandboxes, full, sandboxKey, sandboxKeyOf, &m.counts)
}

// containerKeyOf is containerKey of a decoded container: the decoding
// reads the same three fields the same way (the last on the wire).
func containerKeyOf(c *runtimeapi.Container) (string, itemKey) {
	return c.GetId(), itemKey{state: int32(c.GetState()), createdAt: c.GetCreatedAt()}
}

// sandboxKeyOf is containerKeyOf for a decoded sandbox.
func sandboxKeyOf(sb *runtimeapi.PodSandbox) (string, itemKey) {
	return sb.GetId(), itemKey{state: int32(sb.GetState()), createdAt: sb.GetCreatedAt()}
}

// containerKey reads a listed container's ID, state and creation time,
// without decoding anything else.
func containerKey(b []byte) (id []byte, k itemKey, err error) {
	return scanKey(b, 1, 6, 7)
}

// sandboxKey is containerKey for a listed sandbox.
func sandboxKey(b []byte) (id []byte, k itemKey, err error) {
	return scanKey(b, 1, 3, 4)
}

// scanKey reads the ID (field idNum), state (stateNum) and creation time
// (createdNum) of a listed item. Fields that protobuf would merge (an ID
// sent twice) end as the last one on the wire, as protobuf decodes them.
func scanKey(b []byte, idNum, stateNum, createdNum protowire.Number) (id []byte, k itemKey, err error) {
	err = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == idNum && typ == protowire.BytesType:
			id = v
		case num == stateNum && typ == protowire.VarintType:
			k.state = int32(x)
		case num == createdNum && typ == protowire.VarintType:
			k.createdAt = int64(x)
		}
		return nil
	})
	return id, k, err
}
