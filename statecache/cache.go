package statecache

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Entry is a pod's cached status and the time it was observed.
type Entry[S any] struct {
	Status S
	// Modified is the observation time given to Set, not the time Set ran.
	Modified time.Time
}

// Cache maps pod UIDs to their latest observed status. Set refuses data older
// than what the cache holds, so observations from several sources can be
// applied in any order and the newest wins.
//
// The cache stores statuses as given and hands the same values back: a
// status that holds pointers, maps or slices must not be changed after Set.
//
// The zero Cache is not usable; create one with New. A Cache is safe for
// concurrent use.
type Cache[S any] struct {
	mu sync.Mutex
	// pods holds the entry of every pod; guarded by mu.
	pods map[string]Entry[S]
	// timestamp is the global timestamp: every pod's data is at least this
	// fresh, whether or not its entry says so; guarded by mu.
	timestamp time.Time
	// waiters holds the blocked GetNewerThan calls per pod UID; guarded by mu.
	waiters map[string][]*waiter[S]
}

// waiter is one blocked GetNewerThan call.
type waiter[S any] struct {
	minTime time.Time
	// result receives the answer exactly once, from notify, which removes
	// the waiter from Cache.waiters in the same critical section. Its buffer
	// of one lets notify send under the lock without blocking.
	result chan answer[S]
}

type answer[S any] struct {
	entry Entry[S]
	ok    bool
}

// New returns an empty Cache with a zero global timestamp.
func New[S any]() *Cache[S] {
	return &Cache[S]{
		pods:    make(map[string]Entry[S]),
		waiters: make(map[string][]*waiter[S]),
	}
}

// Get returns the pod's entry and whether the cache holds one. It does not
// block and is safe for concurrent use.
func (c *Cache[S]) Get(podUID string) (Entry[S], bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.pods[podUID]
	return e, ok
}

// Set stores status for the pod as observed at observedAt, unless the cache
// already holds data for the pod observed after observedAt; an observation
// at the same time as the cached one replaces it (newer or equal wins). It
// reports whether it stored the status, and wakes the GetNewerThan calls that
// the new entry satisfies. It does not block and is safe for concurrent use.
func (c *Cache[S]) Set(podUID string, status S, observedAt time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.pods[podUID]; ok && cur.Modified.After(observedAt) {
		return false
	}
	c.pods[podUID] = Entry[S]{Status: status, Modified: observedAt}
	c.notifyLocked(podUID)
	return true
}

// GetNewerThan returns the pod's entry once the cache holds data for the pod
// observed after minTime, or once the global timestamp (see UpdateTime) is
// after minTime; in the second case the pod may be absent, and GetNewerThan
// returns the zero Entry and false. It returns at once if that already holds.
//
// Otherwise it blocks until Set or UpdateTime satisfies it, or until ctx is
// done; then it drops its subscription and returns ctx.Err(). It is safe for
// concurrent use.
func (c *Cache[S]) GetNewerThan(ctx context.Context, podUID string, minTime time.Time) (Entry[S], bool, error) {
	c.mu.Lock()
	if e, ok, done := c.newerLocked(podUID, minTime); done {
		c.mu.Unlock()
		return e, ok, nil
	}
	w := &waiter[S]{minTime: minTime, result: make(chan answer[S], 1)}
	c.waiters[podUID] = append(c.waiters[podUID], w)
	c.mu.Unlock()

	select {
	case a := <-w.result:
		return a.entry, a.ok, nil
	case <-ctx.Done():
	}

	c.mu.Lock()
	removed := c.removeWaiterLocked(podUID, w)
	c.mu.Unlock()
	if !removed {
		// notify answered between ctx ending and the lock: the answer is in
		// the buffer, and it is the better result to give.
		a := <-w.result
		return a.entry, a.ok, nil
	}
	return Entry[S]{}, false, ctx.Err()
}

// Delete removes the pod's entry. Blocked GetNewerThan calls for the pod keep
// waiting. It does not block and is safe for concurrent use.
func (c *Cache[S]) Delete(podUID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pods, podUID)
}

// UpdateTime raises the global timestamp to t, and never lowers it: after a
// full relist that started at t, every pod's data is at least that fresh,
// including the data of pods the relist did not find. It wakes the
// GetNewerThan calls that the new timestamp satisfies. It does not block and
// is safe for concurrent use.
func (c *Cache[S]) UpdateTime(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !t.After(c.timestamp) {
		return
	}
	c.timestamp = t
	for podUID := range c.waiters {
		c.notifyLocked(podUID)
	}
}

// Find returns the first entry, in no particular order, for which match
// returns true, and whether there is one. It holds the cache's lock while
// match runs and copies nothing, so match must be quick and must not call
// the cache; Range is the walk that may. It is safe for concurrent use.
func (c *Cache[S]) Find(match func(podUID string, e Entry[S]) bool) (string, Entry[S], bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, e := range c.pods {
		if match(uid, e) {
			return uid, e, true
		}
	}
	return "", Entry[S]{}, false
}

// Range calls fn for each entry of a snapshot taken when Range starts, in no
// particular order, and stops early when fn returns false. The lock is not
// held while fn runs, so fn may call the cache. It is safe for concurrent
// use.
func (c *Cache[S]) Range(fn func(podUID string, e Entry[S]) bool) {
	type item struct {
		podUID string
		entry  Entry[S]
	}
	c.mu.Lock()
	snapshot := make([]item, 0, len(c.pods))
	for uid, e := range c.pods {
		snapshot = append(snapshot, item{uid, e})
	}
	c.mu.Unlock()

	for _, it := range snapshot {
		if !fn(it.podUID, it.entry) {
			return
		}
	}
}

// newerLocked reports whether a GetNewerThan(podUID, minTime) call is
// satisfied (done) and, if so, what it returns. c.mu must be held.
func (c *Cache[S]) newerLocked(podUID string, minTime time.Time) (e Entry[S], ok, done bool) {
	e, ok = c.pods[podUID]
	if (ok && e.Modified.After(minTime)) || c.timestamp.After(minTime) {
		return e, ok, true
	}
	return Entry[S]{}, false, false
}

// notifyLocked answers and unsubscribes the pod's waiters that the cache now
// satisfies. c.mu must be held; the sends never block (see waiter.result).
func (c *Cache[S]) notifyLocked(podUID string) {
	ws := c.waiters[podUID]
	if len(ws) == 0 {
		return
	}
	ws = slices.DeleteFunc(ws, func(w *waiter[S]) bool {
		e, ok, done := c.newerLocked(podUID, w.minTime)
		if done {
			w.result <- answer[S]{entry: e, ok: ok}
		}
		return done
	})
	c.setWaitersLocked(podUID, ws)
}

// removeWaiterLocked unsubscribes w and reports whether it was still
// subscribed. c.mu must be held.
func (c *Cache[S]) removeWaiterLocked(podUID string, w *waiter[S]) bool {
	ws := c.waiters[podUID]
	i := slices.Index(ws, w)
	if i < 0 {
		return false
	}
	c.setWaitersLocked(podUID, slices.Delete(ws, i, i+1))
	return true
}

// setWaitersLocked stores the pod's waiters, dropping the map key when none
// are left so that pods that come and go leave nothing behind. c.mu must be
// held.
func (c *Cache[S]) setWaitersLocked(podUID string, ws []*waiter[S]) {
	if len(ws) == 0 {
		delete(c.waiters, podUID)
		return
	}
	c.waiters[podUID] = ws
}
