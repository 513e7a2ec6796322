package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// waitTimeout bounds every wait on the in-process server.
const waitTimeout = 10 * time.Second

var t0 = time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)

const (
	podA = "aaaaaaaa-0000-4000-8000-000000000001" // crashes 4 times in 4 minutes
	podB = "bbbbbbbb-0000-4000-8000-000000000002" // 2 crashes, an exit 0, a sandbox exit
	podC = "cccccccc-0000-4000-8000-000000000003" // 3 crashes 8 minutes apart
)

// lifecycle is one event to publish: a pod's container started, or died
// with an exit code, minutes after t0.
type lifecycle struct {
	pod      string
	typ      generator.LifecycleEventType
	minutes  int
	exitCode int32
	sandbox  bool
}

func (l lifecycle) event(i int) generator.Event {
	at := t0.Add(time.Duration(l.minutes) * time.Minute)
	e := generator.Event{
		Type:      l.typ,
		Pod:       generator.Pod{UID: l.pod, Namespace: "default", Name: "web-" + l.pod[:1]},
		Container: generator.Container{ID: l.pod[:8] + "-" + string(rune('a'+i)), Name: "app", Attempt: uint32(i), Sandbox: l.sandbox, Image: "registry.example/app:1"},
		State:     generator.StateRunning,
		StartedAt: at, Time: at, DetectedBy: generator.SourceRelist, ObservedAt: at,
	}
	if l.sandbox {
		e.Container.Name = ""
	}
	if l.typ == generator.ContainerDied {
		code := l.exitCode
		e.State, e.ExitCode, e.FinishedAt = generator.StateExited, &code, at
		if code != 0 {
			e.Reason = "Error"
		}
	}
	return e
}

// publishAll publishes the events with the bridge's encoder and returns
// their stream sequences.
func publishAll(t *testing.T, js jetstream.JetStream, ls []lifecycle, first int) []uint64 {
	t.Helper()
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for i, l := range ls {
		msg, err := enc.Encode(l.event(first + i))
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		ack, err := js.PublishMsg(t.Context(), msg)
		if err != nil {
			t.Fatalf("publish %s: %v", msg.Subject, err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	return seqs
}

// service is one run of the crash-loop service with its own connection,
// as a process would have.
type service struct {
	nc   *nats.Conn
	det  *Detector
	done chan error
}

func TestDetectorCountsEachCrashOnceAcrossACrashAndRestart(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	started, died := generator.ContainerStarted, generator.ContainerDied
	firstHalf := []lifecycle{
		{pod: podA, typ: started, minutes: 0},
		{pod: podC, typ: died, minutes: 0, exitCode: 1},
		{pod: podA, typ: died, minutes: 1, exitCode: 137},
		{pod: podB, typ: died, minutes: 1, exitCode: 1},
		{pod: podA, typ: died, minutes: 2, exitCode: 137}, // the service crashes after counting this one
		{pod: podB, typ: died, minutes: 2, exitCode: 0},
		{pod: podB, typ: died, minutes: 3, exitCode: 255, sandbox: true},
	}
	secondHalf := []lifecycle{
		{pod: podA, typ: died, minutes: 3, exitCode: 137}, // third in the window: reported
		{pod: podC, typ: died, minutes: 8, exitCode: 1},
		{pod: podA, typ: started, minutes: 3},
		{pod: podA, typ: died, minutes: 4, exitCode: 137}, // fourth: reported
		{pod: podB, typ: died, minutes: 5, exitCode: 2},
		{pod: podC, typ: died, minutes: 16, exitCode: 1}, // the first fell out of the window
	}
	seqs := publishAll(t, js, firstHalf, 0)
	crashAt := seqs[4]

	var (
		mu      sync.Mutex
		handled = map[uint64]bool{}   // sequences handled without error; guarded by mu
		reports = map[uint64]string{} // sequence → pod reported; guarded by mu
		again   bool                  // the second run got the crashed event; guarded by mu
	)
	progress := make(chan struct{}, 1)
	opts := consumer.DurableOptions{
		Name: "crashloop", DeliverAll: true, Partitions: 4, AckWait: 300 * time.Millisecond,
		Filter:       consumer.Filter{Type: "ContainerDied"},
		OnDeadLetter: func(d consumer.DeadLetter) { t.Errorf("dead letter: %+v", d) },
	}
	start := func(crash bool) *service {
		nc, sjs := publishtest.Connect(t, url)
		det, err := NewDetector(t.Context(), sjs, DetectorOptions{
			Window: 10 * time.Minute, Threshold: 3,
			OnReport: func(r Report) {
				mu.Lock()
				defer mu.Unlock()
				reports[r.Sequence] = r.PodUID
			},
		})
		if err != nil {
			t.Fatalf("NewDetector: %v", err)
		}
		s := &service{nc: nc, det: det, done: make(chan error, 1)}
		ctx, cancel := context.WithCancel(t.Context())
		t.Cleanup(func() { cancel(); <-s.done })
		go func() {
			s.done <- consumer.Consume(ctx, sjs, opts, func(ctx context.Context, e consumer.Event) error {
				if err := det.Handle(ctx, e); err != nil {
					return err
				}
				if crash && e.Sequence == crashAt {
					// The crash comes after the count is stored and before
					// the acknowledgement: the event comes back.
					nc.Close()
					return errors.New("crashed")
				}
				mu.Lock()
				handled[e.Sequence] = true
				again = again || (!crash && e.Sequence == crashAt)
				mu.Unlock()
				select {
				case progress <- struct{}{}:
				default:
				}
				return nil
			})
		}()
		return s
	}

	first := start(true)
	select {
	case err := <-first.done:
		first.done <- err
		if err == nil {
			t.Fatal("the first run ended without an error; it was to crash")
		}
	case <-time.After(waitTimeout):
		t.Fatal("the first run did not crash")
	}

	seqs = append(seqs, publishAll(t, js, secondHalf, len(firstHalf))...)
	var want []uint64 // every ContainerDied
	for i, l := range slices.Concat(firstHalf, secondHalf) {
		if l.typ == died {
			want = append(want, seqs[i])
		}
	}
	second := start(false)
	deadline := time.After(waitTimeout)
	for {
		mu.Lock()
		all := !slices.ContainsFunc(want, func(s uint64) bool { return !handled[s] })
		mu.Unlock()
		if all {
			break
		}
		select {
		case <-progress:
		case err := <-second.done:
			t.Fatalf("the second run ended: %v", err)
		case <-deadline:
			t.Fatalf("not every crash was handled within %s: %v", waitTimeout, handled)
		}
	}

	wantCrashes := map[string][]uint64{
		podA: {seqs[2], seqs[4], seqs[7], seqs[10]},
		podB: {seqs[3], seqs[11]},
		podC: {seqs[8], seqs[12]},
	}
	for pod, want := range wantCrashes {
		got, err := second.det.Crashes(t.Context(), pod)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("crashes of pod %s (-want +got):\n%s", pod, diff)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !again {
		t.Errorf("event %d, unacknowledged when the first run crashed, was not delivered to the second", crashAt)
	}
	if diff := cmp.Diff(map[uint64]string{seqs[7]: podA, seqs[10]: podA}, reports); diff != "" {
		t.Errorf("reports by sequence (-want +got):\n%s", diff)
	}
}

func TestPodKeyKeepsUIDsAndEncodesTheRest(t *testing.T) {
	t.Parallel()
	for uid, want := range map[string]string{
		"6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70": "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70",
		"a.b":                                  "_612e62",
		"":                                     "_",
	} {
		if got := podKey(uid); got != want {
			t.Errorf("podKey(%q) = %q, want %q", uid, got, want)
		}
	}
}
