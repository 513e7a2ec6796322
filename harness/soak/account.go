package soak

import (
	"cmp"
	"slices"
	"time"
)

// The Lifecycle event types, as the CloudEvent type names them after its
// last dot (consumer.Event.LifecycleType). Their order is the order of one
// container's events in the stream.
const (
	ContainerStarted = "ContainerStarted"
	ContainerDied    = "ContainerDied"
	ContainerRemoved = "ContainerRemoved"
)

// lifecycleStep returns the place of a Lifecycle event type in a
// container's life, -1 for anything else.
func lifecycleStep(t string) int {
	switch t {
	case ContainerStarted:
		return 0
	case ContainerDied:
		return 1
	case ContainerRemoved:
		return 2
	}
	return -1
}

// Transition is one change the churn driver made in the simulated runtime,
// which the bridge must report once.
type Transition struct {
	ContainerID string // the sandbox ID for a sandbox
	PodUID      string
	Sandbox     bool
	Type        string // ContainerStarted, ContainerDied or ContainerRemoved
	// At is when the driver made the runtime call; the simulated runtime
	// stamps the transition with its own clock (the same one) within
	// microseconds after.
	At time.Time
}

// Stored is one message read back from the stream.
type Stored struct {
	Seq         uint64    // stream sequence
	ID          string    // CloudEvent id (= Nats-Msg-Id)
	ContainerID string    // the containerid extension
	PodUID      string    // the poduid extension
	Type        string    // Lifecycle event type
	StoredAt    time.Time // JetStream's storage time
}

// Window is a stretch of the soak: the baseline, one fault and the quiet
// time after it, or the final recovery. A transition belongs to the window
// during which the runtime made it.
type Window struct {
	Name     string
	From, To time.Time // [From, To)
}

// HealthFailure is one /healthz probe that did not answer 200 while the
// bridge process was meant to be up.
type HealthFailure struct {
	At     time.Time
	Detail string // status and body, or the request's error
}

// WindowResult is the accounting of one window's transitions.
type WindowResult struct {
	Window
	Expected int // transitions the driver made
	Found    int // of those, stored at least once
	Missing  int // never stored
	// Unobservable were never stored, and no bridge could have seen them:
	// their container's whole life fell in a time the bridge process was
	// dead, on a runtime that keeps no event for an absent subscriber.
	Unobservable int
	Duplicated   int // stored more than once
	OutOfOrder   int // stored before an earlier step of the same container
	// MaxDelay is the longest time from a transition to its storage in
	// JetStream: the publication stall as a subscriber sees it.
	MaxDelay       time.Duration
	HealthFailures int
}

// Finding is one transition that was not delivered exactly once in order.
type Finding struct {
	Transition
	Window string
	Seqs   []uint64 // stream sequences it was stored at, in order
}

// Accounting is the comparison of the transitions made with what the
// stream holds.
type Accounting struct {
	Windows []WindowResult
	Total   WindowResult // Name "total", From and To of the whole run
	// Missing, Duplicated and OutOfOrder list the transitions at fault, in
	// the order they were made.
	Missing      []Finding
	Unobservable []Finding
	Duplicated   []Finding
	OutOfOrder   []Finding
	// Unexpected are stored messages of no transition the driver made, in
	// stream order.
	Unexpected []Stored
	Health     []HealthFailure
}

// transitionKey identifies a transition, and the message that reports it:
// the CloudEvent id is derived from these two values only (a contract of
// the published events), so counting messages by key counts them by id, and
// also catches one transition stored under two ids.
type transitionKey struct {
	containerID string
	typ         string
}

// account compares the transitions made with the messages stored. windows
// must be in time order; a transition or health failure outside all of them
// is counted in the nearest one (see windowOf).
//
// A transition not stored whose container's every transition falls in one
// of blind is unobservable, not missing, unless the stream holds that
// container's transition of the same or an earlier step: from the first
// step stored on, a bridge saw the container, and the rest of its life is
// due (a ContainerStarted stored just before a SIGKILL makes its Died and
// Removed due). A step before the first one stored is excused when it was
// made in a blind time, whenever the rest of the container's life was: the
// bridge first saw the container later in its life, with no start time to
// report (a sandbox started and stopped while no bridge ran, first seen
// NOTREADY, has none by the contract; a container removed before its
// status could be read has none either). It does no I/O.
func account(windows []Window, made []Transition, stored []Stored, health []HealthFailure, blind []Window) Accounting {
	unseen := unobservable(made, blind)
	// firstStep is the earliest lifecycle step stored of each container.
	firstStep := make(map[string]int, len(stored))
	for _, s := range stored {
		if cur, ok := firstStep[s.ContainerID]; !ok || lifecycleStep(s.Type) < cur {
			firstStep[s.ContainerID] = lifecycleStep(s.Type)
		}
	}
	excused := func(t Transition) bool {
		first, seen := firstStep[t.ContainerID]
		switch {
		case seen && lifecycleStep(t.Type) >= first:
			return false // a bridge saw the container by this step
		case unseen[t.ContainerID]:
			return true // its whole life, and nothing of it stored
		}
		// A later step is stored: this one is excused if no bridge ran
		// when it was made.
		return seen && slices.ContainsFunc(blind, func(b Window) bool { return !t.At.Before(b.From) && t.At.Before(b.To) })
	}
	stored = slices.SortedFunc(slices.Values(stored), func(a, b Stored) int { return cmp.Compare(a.Seq, b.Seq) })
	seqs := make(map[transitionKey][]uint64, len(stored))
	storedAt := make(map[transitionKey]time.Time, len(stored))
	for _, s := range stored {
		k := transitionKey{s.ContainerID, s.Type}
		if len(seqs[k]) == 0 {
			storedAt[k] = s.StoredAt
		}
		seqs[k] = append(seqs[k], s.Seq)
	}
	firstSeq := func(containerID, typ string) (uint64, bool) {
		s := seqs[transitionKey{containerID, typ}]
		if len(s) == 0 {
			return 0, false
		}
		return s[0], true
	}

	a := Accounting{Windows: make([]WindowResult, len(windows)), Health: health}
	for i, w := range windows {
		a.Windows[i].Window = w
	}
	a.Total.Name = "total"
	if len(windows) > 0 {
		a.Total.From, a.Total.To = windows[0].From, windows[len(windows)-1].To
	}
	expected := make(map[transitionKey]bool, len(made))
	for _, t := range made {
		k := transitionKey{t.ContainerID, t.Type}
		expected[k] = true
		w := &a.Total
		name := ""
		if i := windowOf(windows, t.At); i >= 0 {
			w = &a.Windows[i]
			name = w.Name
		}
		w.Expected++
		finding := Finding{Transition: t, Window: name, Seqs: seqs[k]}
		got := seqs[k]
		switch {
		case len(got) == 0 && excused(t):
			w.Unobservable++
			a.Unobservable = append(a.Unobservable, finding)
			continue
		case len(got) == 0:
			w.Missing++
			a.Missing = append(a.Missing, finding)
			continue
		case len(got) > 1:
			w.Duplicated++
			a.Duplicated = append(a.Duplicated, finding)
		}
		w.Found++
		w.MaxDelay = max(w.MaxDelay, storedAt[k].Sub(t.At))
		// Out of order: stored before an earlier step of the same
		// container. Only first copies count: a later duplicate is already
		// reported as such.
		step := lifecycleStep(t.Type)
		for _, earlier := range []string{ContainerStarted, ContainerDied}[:max(step, 0)] {
			if s, ok := firstSeq(t.ContainerID, earlier); ok && s > got[0] {
				w.OutOfOrder++
				a.OutOfOrder = append(a.OutOfOrder, finding)
				break
			}
		}
	}
	for _, s := range stored {
		if !expected[transitionKey{s.ContainerID, s.Type}] {
			a.Unexpected = append(a.Unexpected, s)
		}
	}
	for _, h := range health {
		if i := windowOf(windows, h.At); i >= 0 {
			a.Windows[i].HealthFailures++
		} else {
			a.Total.HealthFailures++
		}
	}
	// The total line sums the windows (with whatever fell outside all of
	// them, when there are none).
	for _, w := range a.Windows {
		a.Total.Expected += w.Expected
		a.Total.Found += w.Found
		a.Total.Missing += w.Missing
		a.Total.Unobservable += w.Unobservable
		a.Total.Duplicated += w.Duplicated
		a.Total.OutOfOrder += w.OutOfOrder
		a.Total.HealthFailures += w.HealthFailures
		a.Total.MaxDelay = max(a.Total.MaxDelay, w.MaxDelay)
	}
	return a
}

// unobservable returns the containers whose every transition made falls
// within one of blind, the whole life from start to removal included.
func unobservable(made []Transition, blind []Window) map[string]bool {
	if len(blind) == 0 {
		return nil
	}
	type span struct {
		from, to time.Time
		removed  bool
	}
	spans := map[string]*span{}
	for _, t := range made {
		sp := spans[t.ContainerID]
		if sp == nil {
			sp = &span{from: t.At, to: t.At}
			spans[t.ContainerID] = sp
		}
		sp.from, sp.to = minTime(sp.from, t.At), maxTime(sp.to, t.At)
		sp.removed = sp.removed || t.Type == ContainerRemoved
	}
	out := map[string]bool{}
	for id, sp := range spans {
		for _, b := range blind {
			if sp.removed && !sp.from.Before(b.From) && sp.to.Before(b.To) {
				out[id] = true
				break
			}
		}
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// windowOf returns the index of the window holding at: the one whose
// [From, To) contains it, else the first for a time before all of them, the
// last for one after them all, and the later one for a time in a gap between
// two. It returns -1 if there are no windows.
func windowOf(windows []Window, at time.Time) int {
	if len(windows) == 0 {
		return -1
	}
	i, _ := slices.BinarySearchFunc(windows, at, func(w Window, at time.Time) int {
		switch {
		case !at.Before(w.To):
			return -1
		case at.Before(w.From):
			return 1
		}
		return 0
	})
	return min(i, len(windows)-1)
}

// Failed reports whether any transition was missing, duplicated or out of
// order, any unexpected event was stored, or /healthz failed while the
// bridge was up.
func (a Accounting) Failed() bool {
	return len(a.Missing) > 0 || len(a.Duplicated) > 0 || len(a.OutOfOrder) > 0 ||
		len(a.Unexpected) > 0 || len(a.Health) > 0
}
