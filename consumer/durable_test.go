package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// newServerStream starts an in-process JetStream server with the
// pleg-bridge stream (prefix "pleg") and returns its URL and a JetStream
// handle for publishing; members of a group connect on their own, so that a
// test can cut one member's connection.
func newServerStream(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	return url, js
}

// podEvents returns perPod events for each of pods pods, interleaved the
// way a node would publish them: a Started, then a Died, and so on, each
// with its own container ID.
func podEvents(pods, perPod int) []fixture {
	var fs []fixture
	for j := range perPod {
		for i := range pods {
			f := died()
			f.podUID = fmt.Sprintf("6f1c2a7e-0000-4000-8000-%012d", i)
			f.pod = fmt.Sprintf("web-%d", i)
			f.containerID = fmt.Sprintf("c%d-%d", i, j)
			if j%2 == 0 {
				f.lifecycle, f.exitCode, f.reason = "ContainerStarted", nil, ""
			}
			fs = append(fs, f)
		}
	}
	return fs
}

// inRound gives the fixtures container IDs of their own for round r, so
// that events published in rounds are different transitions, with ids of
// their own, as a bridge's always are (Consume drops an event whose id it
// handled before: RepeatOptions).
func inRound(fs []fixture, r int) []fixture {
	for i := range fs {
		fs[i].containerID += "-r" + strconv.Itoa(r)
	}
	return fs
}

// member runs Consume in a goroutine with its own connection.
type member struct {
	nc     *nats.Conn
	done   chan error
	cancel context.CancelFunc
}

func startMember(t *testing.T, url string, opts consumer.DurableOptions, fn consumer.Handler) *member {
	t.Helper()
	nc, js := publishtest.Connect(t, url)
	ctx, cancel := context.WithCancel(t.Context())
	m := &member{nc: nc, done: make(chan error, 1), cancel: cancel}
	go func() { m.done <- consumer.Consume(ctx, js, opts, fn) }()
	t.Cleanup(func() {
		cancel()
		<-m.done
		m.done <- nil
	})
	return m
}

// wait returns what Consume returned, failing the test after waitTimeout.
func (m *member) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-m.done:
		m.done <- err // for the cleanup
		return err
	case <-time.After(waitTimeout):
		t.Fatalf("Consume did not return within %s", waitTimeout)
		return nil
	}
}

// stop cancels Consume and returns its result.
func (m *member) stop(t *testing.T) error {
	t.Helper()
	m.cancel()
	return m.wait(t)
}

// handled returns a handler that sends each event to ch and then returns
// what result says for it (nil if result is nil).
func handled(ch chan<- consumer.Event, result consumer.Handler) consumer.Handler {
	return func(ctx context.Context, e consumer.Event) error {
		select {
		case ch <- e:
		case <-ctx.Done():
			return ctx.Err()
		}
		if result == nil {
			return nil
		}
		return result(ctx, e)
	}
}

// receive returns the next n values from ch, failing the test after
// waitTimeout.
func receive[T any](t *testing.T, ch <-chan T, n int) []T {
	t.Helper()
	var got []T
	timeout := time.After(waitTimeout)
	for len(got) < n {
		select {
		case v := <-ch:
			got = append(got, v)
		case <-timeout:
			t.Fatalf("got %d of %d values within %s", len(got), n, waitTimeout)
		}
	}
	return got
}

// sequences returns the stream sequences of events.
func sequences(events []consumer.Event) []uint64 {
	var seqs []uint64
	for _, e := range events {
		seqs = append(seqs, e.Sequence)
	}
	return seqs
}

// checkDrained fails the test unless the group's work stream holds no
// message: every event was acknowledged or dead-lettered.
func checkDrained(t *testing.T, js jetstream.JetStream, opts consumer.DurableOptions) {
	t.Helper()
	s, err := js.Stream(t.Context(), opts.WorkStream())
	if err != nil {
		t.Fatalf("look up work stream: %v", err)
	}
	if n := s.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("work stream %s holds %d messages after the group handled all, want 0", opts.WorkStream(), n)
	}
}

func ignoreDeadLetters(consumer.DeadLetter) {}

func TestConsumeResumesWhereACrashedMemberStopped(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	before := publishEvents(t, js, podEvents(3, 2)...)
	opts := consumer.DurableOptions{
		Name: "resume", DeliverAll: true, Partitions: 1,
		AckWait: 300 * time.Millisecond, OnDeadLetter: ignoreDeadLetters,
	}

	// The first run handles three events and crashes while it holds the
	// fourth: its connection goes away without an acknowledgement, and its
	// handler gives no answer; Consume ends the handler's ctx.
	calls := make(chan consumer.Event)
	var crashed *member
	dead := make(chan struct{})
	crashed = startMember(t, url, opts, handled(calls, func(ctx context.Context, e consumer.Event) error {
		if e.Sequence == before[3].Sequence {
			crashed.nc.Close()
			close(dead)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}))
	if diff := cmp.Diff(before[:4], receive(t, calls, 4)); diff != "" {
		t.Errorf("first run got (-want +got):\n%s", diff)
	}
	<-dead
	if err := crashed.wait(t); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("Consume after its connection closed = %v, want an error wrapping %v", err, nats.ErrConnectionClosed)
	}

	// Events go on while no member runs.
	after := publishEvents(t, js, inRound(podEvents(1, 2), 1)...)

	restarted := startMember(t, url, opts, handled(calls, nil))
	want := append(before[3:], after...)
	if diff := cmp.Diff(want, receive(t, calls, len(want))); diff != "" {
		t.Errorf("after the restart got (-want +got):\n%s", diff)
	}
	if err := restarted.stop(t); err != nil {
		t.Errorf("Consume after cancel = %v, want nil", err)
	}
	checkDrained(t, js, opts)
}

// A partition must ask for its next event as soon as it acknowledged one;
// the Messages iterator of nats.go left a partition idle here under load.
func TestConsumeDeliversThePartitionsNextEventAfterTheAck(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	events := publishEvents(t, js, podEvents(1, 3)...)
	calls := make(chan consumer.Event)
	startMember(t, url, consumer.DurableOptions{Name: "next", DeliverAll: true, OnDeadLetter: ignoreDeadLetters}, handled(calls, nil))
	if diff := cmp.Diff(events, receive(t, calls, len(events))); diff != "" {
		t.Errorf("handler got (-want +got):\n%s", diff)
	}
}

func TestConsumeRedeliversAfterAHandlerError(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	events := publishEvents(t, js, podEvents(1, 2)...)
	errBusy := errors.New("database busy")
	failures := 2
	calls := make(chan consumer.Event)
	m := startMember(t, url, consumer.DurableOptions{
		Name: "retry", DeliverAll: true, Backoff: []time.Duration{time.Millisecond},
		OnDeadLetter: func(d consumer.DeadLetter) { t.Errorf("dead letter %+v", d) },
	}, handled(calls, func(_ context.Context, e consumer.Event) error {
		if e.Sequence == events[0].Sequence && failures > 0 {
			failures--
			return errBusy
		}
		return nil
	}))

	want := []uint64{events[0].Sequence, events[0].Sequence, events[0].Sequence, events[1].Sequence}
	got := receive(t, calls, len(want))
	if diff := cmp.Diff(want, sequences(got)); diff != "" {
		t.Errorf("handler saw sequences (-want +got):\n%s", diff)
	}
	if got[1].ID != events[0].ID {
		t.Errorf("redelivered event has ID %q, want %q", got[1].ID, events[0].ID)
	}
	if err := m.stop(t); err != nil {
		t.Errorf("Consume after cancel = %v, want nil", err)
	}
}

func TestConsumeDeadLettersAnEventThatExhaustsItsDeliveries(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"dead.>"}}); err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	events := publishEvents(t, js, podEvents(1, 2)...)
	errBoom := errors.New("boom")
	calls := make(chan consumer.Event)
	dead := make(chan consumer.DeadLetter, 1)
	opts := consumer.DurableOptions{
		Name: "dlq", DeliverAll: true, MaxDeliveries: 3, Backoff: []time.Duration{time.Millisecond},
		DeadLetterSubject: "dead.pleg", OnDeadLetter: func(d consumer.DeadLetter) { dead <- d },
	}
	m := startMember(t, url, opts, handled(calls, func(_ context.Context, e consumer.Event) error {
		if e.Sequence == events[0].Sequence {
			return errBoom
		}
		return nil
	}))

	want := []uint64{events[0].Sequence, events[0].Sequence, events[0].Sequence, events[1].Sequence}
	if diff := cmp.Diff(want, sequences(receive(t, calls, len(want)))); diff != "" {
		t.Errorf("handler saw sequences (-want +got):\n%s", diff)
	}
	d := receive(t, dead, 1)[0]
	if diff := cmp.Diff(events[0], d.Event); diff != "" {
		t.Errorf("dead letter event (-want +got):\n%s", diff)
	}
	if d.Deliveries != 3 || !errors.Is(d.Err, errBoom) {
		t.Errorf("dead letter after %d deliveries with error %v, want 3 and %v", d.Deliveries, d.Err, errBoom)
	}

	deadStream, err := js.Stream(t.Context(), "DEAD")
	if err != nil {
		t.Fatalf("look up the dead-letter stream: %v", err)
	}
	msg, err := deadStream.GetLastMsgForSubject(t.Context(), "dead.pleg")
	if err != nil {
		t.Fatalf("read the dead-letter stream: %v", err)
	}
	wantHeaders := map[string]string{
		consumer.HeaderDeadLetterGroup:      "dlq",
		consumer.HeaderDeadLetterSequence:   strconv.FormatUint(events[0].Sequence, 10),
		consumer.HeaderDeadLetterSubject:    events[0].NATSSubject,
		consumer.HeaderDeadLetterDeliveries: "3",
		consumer.HeaderDeadLetterError:      "boom",
	}
	for k, v := range wantHeaders {
		if got := msg.Header.Get(k); got != v {
			t.Errorf("dead letter header %s = %q, want %q", k, got, v)
		}
	}
	if _, err := consumer.Decode(events[0].NATSSubject, msg.Header, msg.Data); err != nil {
		t.Errorf("the dead letter does not decode as the original event: %v", err)
	}
	if err := m.stop(t); err != nil {
		t.Errorf("Consume after cancel = %v, want nil", err)
	}
	checkDrained(t, js, opts)
}

func TestConsumeDeadLettersAnEventWhoseLastDeliveryCrashed(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	events := publishEvents(t, js, died())
	dead := make(chan consumer.DeadLetter, 1)
	opts := consumer.DurableOptions{
		Name: "lastcrash", DeliverAll: true, MaxDeliveries: 1, AckWait: 300 * time.Millisecond,
		OnDeadLetter: func(d consumer.DeadLetter) { dead <- d },
	}
	calls := make(chan consumer.Event)
	var crashed *member
	crash := make(chan struct{})
	crashed = startMember(t, url, opts, handled(calls, func(ctx context.Context, _ consumer.Event) error {
		<-crash
		crashed.nc.Close()
		<-ctx.Done() // a dead process never answers
		return ctx.Err()
	}))
	receive(t, calls, 1)
	close(crash)
	if err := crashed.wait(t); err == nil {
		t.Error("Consume after its connection closed = nil, want an error")
	}

	startMember(t, url, opts, handled(calls, nil))
	d := receive(t, dead, 1)[0]
	if d.Event.Sequence != events[0].Sequence || d.Deliveries != 1 || !errors.Is(d.Err, consumer.ErrDeliveriesExhausted) {
		t.Errorf("dead letter for sequence %d after %d deliveries with %v, want %d, 1 and %v",
			d.Event.Sequence, d.Deliveries, d.Err, events[0].Sequence, consumer.ErrDeliveriesExhausted)
	}
	select {
	case e := <-calls:
		t.Errorf("handler called again for sequence %d after its deliveries were exhausted", e.Sequence)
	default:
	}
}

func TestConsumeDeadLettersMessagesThatDoNotDecode(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	publishRaw(t, js, "pleg.node-1.default.x.ContainerDied", "not a CloudEvent")
	good := publishEvents(t, js, died())
	calls := make(chan consumer.Event)
	dead := make(chan consumer.DeadLetter, 1)
	opts := consumer.DurableOptions{Name: "decode", DeliverAll: true, OnDeadLetter: func(d consumer.DeadLetter) { dead <- d }}
	startMember(t, url, opts, handled(calls, nil))

	if diff := cmp.Diff(good, receive(t, calls, 1)); diff != "" {
		t.Errorf("handler got (-want +got):\n%s", diff)
	}
	d := receive(t, dead, 1)[0]
	var de *consumer.DecodeError
	if !errors.As(d.Err, &de) || de.Sequence != 1 || de.NATSSubject != "pleg.node-1.default.x.ContainerDied" {
		t.Errorf("dead letter error %v, want a *DecodeError for message 1 on pleg.node-1.default.x.ContainerDied", d.Err)
	}
	if d.Event.Sequence != 1 || d.Deliveries != 1 {
		t.Errorf("dead letter for sequence %d after %d deliveries, want 1 and 1", d.Event.Sequence, d.Deliveries)
	}
}

func TestConsumeFiltersOnTheServer(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	var fs []fixture
	for _, node := range []string{"node-1", "node-2"} {
		for _, f := range podEvents(2, 2) {
			f.node = node
			fs = append(fs, f)
		}
	}
	all := publishEvents(t, js, fs...)
	var want []consumer.Event
	for _, e := range all {
		if e.Node == "node-2" && e.LifecycleType() == "ContainerDied" {
			want = append(want, e)
		}
	}
	calls := make(chan consumer.Event)
	opts := consumer.DurableOptions{
		Name: "filtered", DeliverAll: true, Partitions: 1, OnDeadLetter: ignoreDeadLetters,
		Filter: consumer.Filter{Node: "node-2", Type: "ContainerDied"},
	}
	m := startMember(t, url, opts, handled(calls, nil))
	if diff := cmp.Diff(want, receive(t, calls, len(want))); diff != "" {
		t.Errorf("handler got (-want +got):\n%s", diff)
	}
	if err := m.stop(t); err != nil {
		t.Errorf("Consume after cancel = %v, want nil", err)
	}
	// Only the matching events were copied into the work stream.
	s, err := js.Stream(t.Context(), opts.WorkStream())
	if err != nil {
		t.Fatalf("look up work stream: %v", err)
	}
	if got := s.CachedInfo().State.LastSeq; got != uint64(len(want)) {
		t.Errorf("work stream received %d messages, want the %d matching ones", got, len(want))
	}
}

func TestConsumeStartsANewGroupWithTheEventsAfterIt(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	publishEvents(t, js, podEvents(2, 1)...)
	opts := consumer.DurableOptions{Name: "fresh", OnDeadLetter: ignoreDeadLetters}
	calls := make(chan consumer.Event)
	startMember(t, url, opts, handled(calls, nil))
	publishtest.WaitStream(t, js, opts.WorkStream())

	want := publishEvents(t, js, podEvents(1, 1)...)
	if diff := cmp.Diff(want, receive(t, calls, len(want))); diff != "" {
		t.Errorf("handler got (-want +got):\n%s", diff)
	}
}

func TestConsumeSplitsTheLoadAndKeepsEachPodsOrder(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	opts := consumer.DurableOptions{
		Name: "split", DeliverAll: true, Partitions: 4,
		Backoff: []time.Duration{time.Millisecond}, OnDeadLetter: ignoreDeadLetters,
	}
	var (
		mu       sync.Mutex
		busy     = map[string]bool{}   // pod UID → a handler call is running; guarded by mu
		last     = map[string]uint64{} // pod UID → last sequence handled; guarded by mu
		done     = map[uint64]int{}    // sequence → times the work was done; guarded by mu
		calls    = map[uint64]int{}    // sequence → handler calls; guarded by mu
		byMember = map[string]int{}    // member → events it did the work for; guarded by mu
	)
	fresh := make(chan uint64)
	handler := func(name string) consumer.Handler {
		return func(ctx context.Context, e consumer.Event) error {
			mu.Lock()
			if busy[e.PodUID] {
				t.Errorf("pod %s: event %d handled while another of its events is", e.PodUID, e.Sequence)
			}
			if e.Sequence < last[e.PodUID] {
				t.Errorf("pod %s: event %d handled after event %d", e.PodUID, e.Sequence, last[e.PodUID])
			}
			busy[e.PodUID], last[e.PodUID] = true, e.Sequence
			calls[e.Sequence]++
			first := done[e.Sequence] == 0 // the idempotency check a service makes
			if first {
				done[e.Sequence]++
				byMember[name]++
			}
			// Every fifth event fails once after its work was done, as if
			// the member crashed before its acknowledgement.
			fail := e.Sequence%5 == 0 && calls[e.Sequence] == 1
			mu.Unlock()

			runtime.Gosched() // give an overlapping call the chance to show

			mu.Lock()
			busy[e.PodUID] = false
			mu.Unlock()
			if first {
				select {
				case fresh <- e.Sequence:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if fail {
				return errors.New("crashed before the ack")
			}
			return nil
		}
	}
	startMember(t, url, opts, handler("a"))
	startMember(t, url, opts, handler("b"))

	// Publish in rounds until both members have taken part: a member that
	// starts late finds the first rounds done, but not the later ones.
	const rounds, maxRounds = 3, 50
	published := 0
	for r := 0; ; r++ {
		published += len(publishEvents(t, js, inRound(podEvents(10, 2), r)...))
		receive(t, fresh, 20)
		mu.Lock()
		both := byMember["a"] > 0 && byMember["b"] > 0
		mu.Unlock()
		if both && r+1 >= rounds {
			break
		}
		if r+1 == maxRounds {
			t.Fatalf("after %d rounds one member has handled nothing: %v", maxRounds, byMember)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if len(done) != published {
		t.Errorf("%d events handled, want all %d", len(done), published)
	}
	for seq, n := range done {
		if n != 1 {
			t.Errorf("event %d counted %d times, want once", seq, n)
		}
	}
	redelivered := 0
	for seq, n := range calls {
		if n > 1 {
			redelivered++
			if seq%5 != 0 {
				t.Errorf("event %d handled %d times, want once: it never failed", seq, n)
			}
		}
	}
	if redelivered == 0 {
		t.Error("no failed event was delivered again")
	}
	t.Logf("members handled %v of %d events", byMember, published)
}

func TestConsumeRefusesAGroupWithOtherPartitions(t *testing.T) {
	t.Parallel()
	url, js := newServerStream(t)
	opts := consumer.DurableOptions{Name: "fixed", DeliverAll: true, Partitions: 2, OnDeadLetter: ignoreDeadLetters}
	calls := make(chan consumer.Event)
	m := startMember(t, url, opts, handled(calls, nil))
	publishEvents(t, js, died())
	receive(t, calls, 1)
	if err := m.stop(t); err != nil {
		t.Fatalf("Consume after cancel = %v, want nil", err)
	}

	opts.Partitions = 3
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	err := consumer.Consume(ctx, js, opts, handled(calls, nil))
	if !errors.Is(err, consumer.ErrGroupChanged) {
		t.Errorf("Consume with 3 partitions on a group of 2 = %v, want %v", err, consumer.ErrGroupChanged)
	}
}

func TestConsumeRefusesBadOptions(t *testing.T) {
	t.Parallel()
	_, js := newServerStream(t)
	ok := consumer.DurableOptions{Name: "ok", OnDeadLetter: ignoreDeadLetters}
	tests := []struct {
		name    string
		change  func(*consumer.DurableOptions)
		wantErr string
	}{
		{name: "a group needs a name", change: func(o *consumer.DurableOptions) { o.Name = "" }, wantErr: `group name ""`},
		{name: "a name with a dot is refused", change: func(o *consumer.DurableOptions) { o.Name = "a.b" }, wantErr: `group name "a.b"`},
		{name: "dead letters must go somewhere", change: func(o *consumer.DurableOptions) { o.OnDeadLetter = nil }, wantErr: "dead letters would be lost"},
		{name: "an unknown type is named", change: func(o *consumer.DurableOptions) { o.Filter.Type = "Boom" }, wantErr: `"Boom"`},
		{name: "too many partitions", change: func(o *consumer.DurableOptions) { o.Partitions = 5000 }, wantErr: "partitions 5000"},
		{name: "DeliverAll and StartTime contradict each other", change: func(o *consumer.DurableOptions) {
			o.DeliverAll, o.StartTime = true, time.Now()
		}, wantErr: "DeliverAll and StartTime"},
		{name: "a negative repeat window is named", change: func(o *consumer.DurableOptions) { o.Repeats.Window = -time.Minute }, wantErr: "Repeats.Window -1m0s"},
		{name: "a negative repeat bound is named", change: func(o *consumer.DurableOptions) { o.Repeats.MaxIDs = -1 }, wantErr: "Repeats.MaxIDs -1"},
		{name: "a negative rollback check is named", change: func(o *consumer.DurableOptions) { o.RollbackCheck = -time.Second }, wantErr: "RollbackCheck -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := ok
			tt.change(&opts)
			err := consumer.Consume(t.Context(), js, opts, func(context.Context, consumer.Event) error { return nil })
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Consume = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestConsumeNeedsOnlyTheDocumentedPermissions runs a group as a user with
// the reader's permissions of deploy/nats plus those docs/consuming.md lists for a
// group named "perm", so that list is known to be enough.
func TestConsumeNeedsOnlyTheDocumentedPermissions(t *testing.T) {
	t.Parallel()
	reader := []string{
		"$JS.API.INFO", "$JS.API.STREAM.INFO.PLEG", "$JS.API.STREAM.MSG.GET.PLEG", "$JS.API.DIRECT.GET.PLEG.>",
		"$JS.API.CONSUMER.CREATE.PLEG", "$JS.API.CONSUMER.CREATE.PLEG.>", "$JS.API.CONSUMER.DURABLE.CREATE.PLEG.>",
		"$JS.API.CONSUMER.INFO.PLEG.>", "$JS.API.CONSUMER.LIST.PLEG", "$JS.API.CONSUMER.NAMES.PLEG",
		"$JS.API.CONSUMER.MSG.NEXT.PLEG.>", "$JS.API.CONSUMER.DELETE.PLEG.>", "$JS.ACK.PLEG.>", "$JS.FC.PLEG.>",
	}
	group := []string{
		"$JS.API.STREAM.INFO.PLEG_perm", "$JS.API.STREAM.CREATE.PLEG_perm",
		"$JS.API.CONSUMER.CREATE.PLEG_perm.>", "$JS.API.CONSUMER.MSG.NEXT.PLEG_perm.>", "$JS.ACK.PLEG_perm.>",
		"deadletter.perm",
	}
	s := publishtest.NewAuthServer(t, &server.Options{
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "svc", Password: "svc", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: append(reader, group...)},
				Subscribe: &server.SubjectPermission{Allow: []string{"pleg.>", "_INBOX.>"}},
			}},
		},
	})
	_, js := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("admin", "admin"))
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"deadletter.>"}}); err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	events := publishEvents(t, js, podEvents(2, 2)...)
	failed := false
	calls := make(chan consumer.Event)
	dead := make(chan consumer.DeadLetter, 1)
	svcURL := strings.Replace(s.ClientURL(), "nats://", "nats://svc:svc@", 1)
	startMember(t, svcURL, consumer.DurableOptions{
		Name: "perm", DeliverAll: true, Partitions: 1, MaxDeliveries: 1,
		DeadLetterSubject: "deadletter.perm", OnDeadLetter: func(d consumer.DeadLetter) { dead <- d },
	}, handled(calls, func(context.Context, consumer.Event) error {
		if !failed {
			failed = true
			return errors.New("fail the first one to dead-letter it")
		}
		return nil
	}))
	if diff := cmp.Diff(events, receive(t, calls, len(events))); diff != "" {
		t.Errorf("handler got (-want +got):\n%s", diff)
	}
	receive(t, dead, 1)
}
