package statecache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// t0 is an arbitrary observation time; tests use offsets from it.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

// waiterCount returns the number of blocked GetNewerThan subscriptions.
func (c *Cache[S]) waiterCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ws := range c.waiters {
		n += len(ws)
	}
	return n
}

type set struct {
	uid    string
	status string
	at     time.Time
}

func TestSet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		before     []set
		deleteUID  string
		set        set
		wantStored bool
		want       map[string]Entry[string]
	}{
		{
			name:       "a pod not yet cached is stored",
			set:        set{"a", "running", at(1)},
			wantStored: true,
			want:       map[string]Entry[string]{"a": {"running", at(1)}},
		},
		{
			name:       "newer data replaces older data",
			before:     []set{{"a", "running", at(1)}},
			set:        set{"a", "exited", at(2)},
			wantStored: true,
			want:       map[string]Entry[string]{"a": {"exited", at(2)}},
		},
		{
			name:       "data observed at the same time replaces the cached data",
			before:     []set{{"a", "running", at(1)}},
			set:        set{"a", "exited", at(1)},
			wantStored: true,
			want:       map[string]Entry[string]{"a": {"exited", at(1)}},
		},
		{
			name:       "older data is refused and the cached entry is kept",
			before:     []set{{"a", "exited", at(2)}},
			set:        set{"a", "running", at(1)},
			wantStored: false,
			want:       map[string]Entry[string]{"a": {"exited", at(2)}},
		},
		{
			name:       "data for one pod does not compete with another pod's newer data",
			before:     []set{{"b", "running", at(5)}},
			set:        set{"a", "running", at(1)},
			wantStored: true,
			want: map[string]Entry[string]{
				"a": {"running", at(1)},
				"b": {"running", at(5)},
			},
		},
		{
			name:       "a deleted pod accepts data older than what it held",
			before:     []set{{"a", "exited", at(2)}},
			deleteUID:  "a",
			set:        set{"a", "running", at(1)},
			wantStored: true,
			want:       map[string]Entry[string]{"a": {"running", at(1)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := New[string]()
			for _, s := range tt.before {
				c.Set(s.uid, s.status, s.at)
			}
			if tt.deleteUID != "" {
				c.Delete(tt.deleteUID)
			}
			if got := c.Set(tt.set.uid, tt.set.status, tt.set.at); got != tt.wantStored {
				t.Errorf("Set(%q, %q, %v) = %v, want %v", tt.set.uid, tt.set.status, tt.set.at, got, tt.wantStored)
			}
			if diff := cmp.Diff(tt.want, contents(t, c)); diff != "" {
				t.Errorf("cache contents (-want +got):\n%s", diff)
			}
		})
	}
}

// contents returns everything in c, read through Range, and checks that Get
// agrees.
func contents[S any](t *testing.T, c *Cache[S]) map[string]Entry[S] {
	t.Helper()
	m := make(map[string]Entry[S])
	c.Range(func(uid string, e Entry[S]) bool {
		m[uid] = e
		return true
	})
	for uid, e := range m {
		if got, ok := c.Get(uid); !ok || !got.Modified.Equal(e.Modified) {
			t.Errorf("Get(%q) = %v, %v; Range gave %v", uid, got, ok, e)
		}
	}
	return m
}

func TestGetOfAnAbsentPodReportsFalse(t *testing.T) {
	t.Parallel()
	c := New[string]()
	c.Set("a", "running", at(1))
	c.Delete("a")
	if e, ok := c.Get("a"); ok || e != (Entry[string]{}) {
		t.Errorf("Get after Delete = %v, %v; want the zero Entry, false", e, ok)
	}
	if got := contents(t, c); len(got) != 0 {
		t.Errorf("cache after Delete holds %v, want nothing", got)
	}
}

// TestUpdateTime reads the global timestamp the way callers see it: a
// GetNewerThan for a pod the cache does not hold returns at once exactly
// when the timestamp is after its minTime.
func TestUpdateTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		updates []time.Time
		want    time.Time
	}{
		{"a new cache has the zero time", nil, time.Time{}},
		{"the timestamp is raised", []time.Time{at(1), at(3)}, at(3)},
		{"an older time never lowers the timestamp", []time.Time{at(3), at(1)}, at(3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := New[int]()
			for _, u := range tt.updates {
				c.UpdateTime(u)
			}
			if !tt.want.IsZero() && !newerThan(c, tt.want.Add(-time.Nanosecond)) {
				t.Errorf("the timestamp is not after %v, want %v", tt.want.Add(-time.Nanosecond), tt.want)
			}
			if newerThan(c, tt.want) {
				t.Errorf("the timestamp is after %v, want %v", tt.want, tt.want)
			}
		})
	}
}

// newerThan reports whether c's global timestamp is after minTime, without
// waiting.
func newerThan[S any](c *Cache[S], minTime time.Time) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a done context: GetNewerThan answers only what already holds
	_, _, err := c.GetNewerThan(ctx, "a pod the cache does not hold", minTime)
	return err == nil
}

func TestRange(t *testing.T) {
	t.Parallel()
	t.Run("stops when fn returns false", func(t *testing.T) {
		t.Parallel()
		c := New[int]()
		for i := range 5 {
			c.Set(fmt.Sprint(i), i, at(i))
		}
		calls := 0
		c.Range(func(string, Entry[int]) bool {
			calls++
			return calls < 2
		})
		if calls != 2 {
			t.Errorf("fn called %d times, want 2", calls)
		}
	})
	t.Run("fn may change the cache without deadlock and sees the snapshot", func(t *testing.T) {
		t.Parallel()
		c := New[int]()
		c.Set("a", 1, at(1))
		c.Set("b", 2, at(1))
		seen := map[string]int{}
		c.Range(func(uid string, e Entry[int]) bool {
			seen[uid] = e.Status
			c.Delete("a")
			c.Delete("b")
			c.Set("c", 3, at(2))
			return true
		})
		if diff := cmp.Diff(map[string]int{"a": 1, "b": 2}, seen); diff != "" {
			t.Errorf("Range saw (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]Entry[int]{"c": {3, at(2)}}, contents(t, c)); diff != "" {
			t.Errorf("cache after Range (-want +got):\n%s", diff)
		}
	})
}

type result struct {
	Entry Entry[string]
	OK    bool
	Err   error
}

// getNewerThan runs GetNewerThan in a goroutine and delivers its result.
func getNewerThan(ctx context.Context, c *Cache[string], uid string, minTime time.Time) <-chan result {
	ch := make(chan result, 1)
	go func() {
		e, ok, err := c.GetNewerThan(ctx, uid, minTime)
		ch <- result{e, ok, err}
	}()
	return ch
}

func TestGetNewerThanReturnsAtOnceWhenAlreadySatisfied(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		sets    []set
		global  time.Time
		minTime time.Time
		want    result
	}{
		{
			name:    "the pod's data is newer than minTime",
			sets:    []set{{"a", "running", at(2)}},
			minTime: at(1),
			want:    result{Entry[string]{"running", at(2)}, true, nil},
		},
		{
			name:    "the global timestamp is newer and the pod's data is older",
			sets:    []set{{"a", "running", at(1)}},
			global:  at(5),
			minTime: at(3),
			want:    result{Entry[string]{"running", at(1)}, true, nil},
		},
		{
			name:    "the global timestamp is newer and the pod is absent",
			sets:    []set{{"b", "running", at(9)}},
			global:  at(5),
			minTime: at(3),
			want:    result{Entry[string]{}, false, nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := New[string]()
			for _, s := range tt.sets {
				c.Set(s.uid, s.status, s.at)
			}
			c.UpdateTime(tt.global)
			// A done context proves GetNewerThan did not need to wait.
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			e, ok, err := c.GetNewerThan(ctx, "a", tt.minTime)
			if diff := cmp.Diff(tt.want, result{e, ok, err}); diff != "" {
				t.Errorf("GetNewerThan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGetNewerThanBlocksUntilWoken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		setup   func(c *Cache[string])
		minTime time.Time
		// noWake must leave the waiter blocked; wake must answer it.
		noWake func(c *Cache[string])
		wake   func(c *Cache[string])
		want   result
	}{
		{
			name:    "Set with data newer than minTime wakes the waiter",
			setup:   func(c *Cache[string]) { c.Set("a", "running", at(1)) },
			minTime: at(1),
			noWake: func(c *Cache[string]) {
				c.Set("a", "running", at(1)) // equal is not newer
				c.Set("b", "running", at(9)) // another pod
				c.Set("a", "created", at(0)) // stale, refused
			},
			wake: func(c *Cache[string]) { c.Set("a", "exited", at(2)) },
			want: result{Entry[string]{"exited", at(2)}, true, nil},
		},
		{
			name:    "UpdateTime past minTime wakes the waiter with the pod's current entry",
			setup:   func(c *Cache[string]) { c.Set("a", "running", at(1)) },
			minTime: at(3),
			noWake: func(c *Cache[string]) {
				c.UpdateTime(at(3)) // equal is not newer
				c.Set("a", "exited", at(2))
			},
			wake: func(c *Cache[string]) { c.UpdateTime(at(4)) },
			want: result{Entry[string]{"exited", at(2)}, true, nil},
		},
		{
			name:    "UpdateTime past minTime wakes the waiter of an absent pod with ok false",
			minTime: at(3),
			noWake: func(c *Cache[string]) {
				c.UpdateTime(at(2))
				c.Set("a", "running", at(3))
				c.Delete("a") // Delete wakes nobody
			},
			wake: func(c *Cache[string]) { c.UpdateTime(at(4)) },
			want: result{Entry[string]{}, false, nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c := New[string]()
				if tt.setup != nil {
					tt.setup(c)
				}
				got := getNewerThan(t.Context(), c, "a", tt.minTime)
				synctest.Wait()
				tt.noWake(c)
				synctest.Wait()
				select {
				case r := <-got:
					t.Fatalf("GetNewerThan returned %+v before it was satisfied", r)
				default:
				}
				if n := c.waiterCount(); n != 1 {
					t.Fatalf("waiters while blocked = %d, want 1", n)
				}

				tt.wake(c)
				synctest.Wait()
				select {
				case r := <-got:
					if diff := cmp.Diff(tt.want, r); diff != "" {
						t.Errorf("GetNewerThan (-want +got):\n%s", diff)
					}
				default:
					t.Fatal("GetNewerThan still blocked after it was satisfied")
				}
				if n := c.waiterCount(); n != 0 {
					t.Errorf("waiters after wake = %d, want 0", n)
				}
			})
		})
	}
}

func TestGetNewerThanWakesOnlySatisfiedWaiters(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		c := New[string]()
		early := getNewerThan(ctx, c, "a", at(1))
		late := getNewerThan(ctx, c, "a", at(5))
		other := getNewerThan(ctx, c, "b", at(1))
		synctest.Wait()

		c.Set("a", "running", at(3))
		synctest.Wait()
		select {
		case r := <-early:
			if diff := cmp.Diff(result{Entry[string]{"running", at(3)}, true, nil}, r); diff != "" {
				t.Errorf("early waiter (-want +got):\n%s", diff)
			}
		default:
			t.Error("waiter for data after at(1) still blocked after Set at at(3)")
		}
		if n := c.waiterCount(); n != 2 {
			t.Errorf("waiters left = %d, want 2 (late and other)", n)
		}

		cancel()
		synctest.Wait()
		for name, ch := range map[string]<-chan result{"late": late, "other": other} {
			if r := <-ch; !errors.Is(r.Err, context.Canceled) {
				t.Errorf("%s waiter after cancel returned %+v, want context.Canceled", name, r)
			}
		}
	})
}

func TestGetNewerThanEndsWithContext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ctx  func(ctx context.Context) (context.Context, context.CancelFunc)
		// cancel ends the context, or is false to let its deadline pass.
		cancel   bool
		wantErr  error
		wantWait time.Duration
	}{
		{
			name:    "cancel returns context.Canceled at once",
			ctx:     context.WithCancel,
			cancel:  true,
			wantErr: context.Canceled,
		},
		{
			name: "a deadline returns context.DeadlineExceeded when it passes",
			ctx: func(ctx context.Context) (context.Context, context.CancelFunc) {
				return context.WithTimeout(ctx, time.Minute)
			},
			wantErr:  context.DeadlineExceeded,
			wantWait: time.Minute,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := tt.ctx(t.Context())
				defer cancel()
				c := New[string]()
				c.Set("a", "running", at(1))
				start := time.Now()
				got := getNewerThan(ctx, c, "a", at(1))
				synctest.Wait()
				if n := c.waiterCount(); n != 1 {
					t.Fatalf("waiters while blocked = %d, want 1", n)
				}

				if tt.cancel {
					cancel()
				}
				// Virtual time advances to the deadline while all wait here.
				r := <-got
				if !errors.Is(r.Err, tt.wantErr) || r.OK {
					t.Errorf("GetNewerThan = %+v, want ok false and %v", r, tt.wantErr)
				}
				if waited := time.Since(start); waited != tt.wantWait {
					t.Errorf("GetNewerThan returned after %v, want %v", waited, tt.wantWait)
				}
				if n := c.waiterCount(); n != 0 {
					t.Errorf("waiters after the context ended = %d, want 0", n)
				}
			})
		})
	}
}

// TestConcurrentUse hammers one cache from many goroutines; run it with -race.
// Because Set refuses older data and nothing deletes, every reader must see
// each pod's Modified never go back, and each pod must end with the newest
// observation any writer made.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	const (
		pods    = 8
		writers = 16
		readers = 8
		rounds  = 300
	)
	c := New[int]()
	uid := func(i int) string { return fmt.Sprintf("pod-%d", i%pods) }
	// Each (writer, round) has its own observation time; taking them modulo
	// half the range makes writers go back in time, so many Sets are stale.
	observed := func(w, r int) time.Time { return at((r*writers + (w*7)%writers) % (rounds * writers / 2)) }

	// Waiters for a time only the final UpdateTime reaches.
	final := at(rounds * writers)
	var waiters sync.WaitGroup
	waitErrs := make(chan error, pods)
	for p := range pods {
		waiters.Go(func() {
			_, _, err := c.GetNewerThan(t.Context(), uid(p), final.Add(-time.Nanosecond))
			waitErrs <- err
		})
	}

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				c.Set(uid(w+r), w, observed(w, r))
			}
		})
	}
	regressions := make(chan string, readers)
	for g := range readers {
		wg.Go(func() {
			last := map[string]time.Time{}
			for r := range rounds {
				id := uid(g + r)
				if e, ok := c.Get(id); ok {
					if e.Modified.Before(last[id]) {
						regressions <- fmt.Sprintf("%s went from %v back to %v", id, last[id], e.Modified)
						return
					}
					last[id] = e.Modified
				}
				c.Range(func(string, Entry[int]) bool { return true })
				c.UpdateTime(at(r))
			}
		})
	}
	wg.Wait()
	close(regressions)
	for msg := range regressions {
		t.Error(msg)
	}

	want := map[string]time.Time{}
	for w := range writers {
		for r := range rounds {
			if id, o := uid(w+r), observed(w, r); o.After(want[id]) {
				want[id] = o
			}
		}
	}
	got := map[string]time.Time{}
	c.Range(func(id string, e Entry[int]) bool {
		got[id] = e.Modified
		return true
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("final Modified per pod (-want +got):\n%s", diff)
	}

	c.UpdateTime(final)
	waiters.Wait()
	close(waitErrs)
	for err := range waitErrs {
		if err != nil {
			t.Errorf("GetNewerThan woken by UpdateTime returned %v", err)
		}
	}
	if n := c.waiterCount(); n != 0 {
		t.Errorf("waiters left = %d, want 0", n)
	}
}

func TestFind(t *testing.T) {
	t.Parallel()
	c := New[int]()
	for i := range 5 {
		c.Set(fmt.Sprint(i), i*10, at(i))
	}
	uid, e, ok := c.Find(func(_ string, e Entry[int]) bool { return e.Status == 30 })
	if !ok || uid != "3" || e.Status != 30 || !e.Modified.Equal(at(3)) {
		t.Errorf("Find(status 30) = %q, %+v, %v; want pod 3 set at %v", uid, e, ok, at(3))
	}
	if uid, _, ok := c.Find(func(string, Entry[int]) bool { return false }); ok || uid != "" {
		t.Errorf("Find(nothing) = %q, %v; want no entry", uid, ok)
	}
	// Concurrent writers and finders: the race detector checks the lock.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 100 {
				c.Set(fmt.Sprint(i), j, at(j))
				c.Find(func(uid string, _ Entry[int]) bool { return uid == "4" })
			}
		})
	}
	wg.Wait()
}
