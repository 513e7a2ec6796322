package fleet

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/harness/proc"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Subject layouts MeasureSubjectMemory compares. Each names where a
// message of pod p's event goes; the messages are the same in all of them.
const (
	// LayoutLegacy is <prefix>.<node>.<podUID>.<eventType>, the subject
	// before the namespace token: 3 subjects a pod.
	LayoutLegacy = "legacy"
	// LayoutCurrent is <prefix>.<node>.<namespace>.<podUID>.<eventType>,
	// DESIGN.md §4: 3 subjects a pod.
	LayoutCurrent = "current"
	// LayoutPod is <prefix>.<node>.<namespace>.<podUID>: one subject a
	// pod, the event type left to the message.
	LayoutPod = "pod"
	// LayoutNodeNamespace is <prefix>.<node>.<namespace>: what an archive
	// stream holds when its source's subjects are transformed to the node
	// and namespace tokens; its subjects do not grow with the pods.
	LayoutNodeNamespace = "node-namespace"
	// LayoutArchive is the design of PLEG_ARCHIVE_MAX_AGE measured as a
	// whole: the messages published in LayoutCurrent into the event
	// stream, which an archive stream (publish.EnsureArchive) sources
	// into <prefix>.<node>.<ns>.%.<type>; then the event stream cut to
	// its last ArchiveLiveShare of the messages, as a 24 h stream beside a
	// 7-day archive. Its figures are both streams' together.
	LayoutArchive = "archive"
)

// ArchiveLiveShare is the part of the messages the event stream keeps in
// LayoutArchive: one day of a week.
const ArchiveLiveShare = 7

// AllLayouts lists every layout in table order.
var AllLayouts = []string{LayoutLegacy, LayoutCurrent, LayoutPod, LayoutNodeNamespace, LayoutArchive}

// layoutPattern is each layout's subject, for people.
var layoutPattern = map[string]string{
	LayoutLegacy:        "<prefix>.<node>.<uid>.<type>",
	LayoutCurrent:       "<prefix>.<node>.<ns>.<uid>.<type>",
	LayoutPod:           "<prefix>.<node>.<ns>.<uid>",
	LayoutNodeNamespace: "<prefix>.<node>.<ns>",
	LayoutArchive:       "current, last 1/7 kept; archive <prefix>.<node>.<ns>.%.<type>",
}

// minDuplicateWindow is the shortest duplicate window nats-server
// accepts (v2.15.2 refuses less than 100 ms, and takes 0 as its default
// of 2 minutes): a window of 0 in SubjectMemOptions stands for it, the
// nearest to no deduplication a stream can have.
const minDuplicateWindow = 100 * time.Millisecond

// publishWindow is how many messages MeasureSubjectMemory has in flight
// before it waits for the oldest ack: below nats.go's own limit of 4,000
// pending asynchronous publications, so a publication never stalls.
const publishWindow = 1024

// contentType is the Content-Type header of a structured-mode CloudEvent,
// as the bridge sends it with Nats-Msg-Id.
const contentType = "application/cloudevents+json; charset=utf-8"

// Defaults of SubjectMemOptions: 300,000 messages of about 1,250 bytes
// stored, 100,000 pods of 3 events over 1,000 nodes and 50 namespaces.
const (
	DefaultSubjectMemPods         = 100_000
	DefaultSubjectMemNodes        = 1_000
	DefaultSubjectMemNamespaces   = 50
	DefaultSubjectMemEventsPerPod = 3
	// DefaultSubjectMemDataSize is the data of a message; with the current
	// layout's subject and the two headers the stream stores about 1,250
	// bytes a message, as the fleet measured for real events.
	DefaultSubjectMemDataSize = 1_020
	DefaultSubjectMemRuns     = 3
	DefaultSubjectMemSettle   = 15 * time.Second
)

// DefaultSubjectMemWindows are the duplicate windows measured by default:
// the production default, and none (the server's least).
var DefaultSubjectMemWindows = []time.Duration{publish.DefaultDuplicateWindow, 0}

// SubjectMemOptions configures MeasureSubjectMemory. The zero value of a
// field means its default; errors name the flags of pleg-bridge fleet
// subjects, which carry the same names.
type SubjectMemOptions struct {
	// Pods, spread over Nodes nodes (pod p on node p mod Nodes) and
	// Namespaces namespaces (pod p in namespace (p / Nodes) mod
	// Namespaces), each making EventsPerPod events: the event types in
	// turn, a new container every three. Default 100,000 pods of 3 events
	// over 1,000 nodes and 50 namespaces.
	Pods, Nodes, Namespaces, EventsPerPod int
	// DataSize is the bytes of each message's data. Default 1,020.
	DataSize int
	// Layouts are measured in this order. Default AllLayouts.
	Layouts []string
	// DuplicateWindows are the streams' duplicate windows; each layout is
	// measured with each. 0 means none: the server's least, 100 ms.
	// Default 2 minutes and none.
	DuplicateWindows []time.Duration
	// Runs is how many times each measurement is made, all layouts in
	// turn, so that the machine's load drifts over all of them alike.
	// Default 3.
	Runs int
	// Settle is how long the server's memory is sampled after its
	// restart; the lowest sample is the figure. Default 15s.
	Settle time.Duration
	// Dir is the run directory: one directory per measurement, with its
	// server's log and store; each store is removed once measured.
	// Required.
	Dir string
	// ChildCommand runs RunChild, as Options.ChildCommand. Required.
	ChildCommand []string
	// Stdout gets one line of progress per measurement; nil discards it.
	Stdout io.Writer
}

func (o SubjectMemOptions) withDefaults() (SubjectMemOptions, error) {
	o.Pods = orDefault(o.Pods, DefaultSubjectMemPods)
	o.Nodes = orDefault(o.Nodes, DefaultSubjectMemNodes)
	o.Namespaces = orDefault(o.Namespaces, DefaultSubjectMemNamespaces)
	o.EventsPerPod = orDefault(o.EventsPerPod, DefaultSubjectMemEventsPerPod)
	o.DataSize = orDefault(o.DataSize, DefaultSubjectMemDataSize)
	o.Runs = orDefault(o.Runs, DefaultSubjectMemRuns)
	o.Settle = orDefault(o.Settle, DefaultSubjectMemSettle)
	if o.Layouts == nil {
		o.Layouts = AllLayouts
	}
	if o.DuplicateWindows == nil {
		o.DuplicateWindows = DefaultSubjectMemWindows
	}
	o.Layouts = slices.Clone(o.Layouts)
	o.DuplicateWindows = slices.Clone(o.DuplicateWindows)
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}

	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, f := range []struct {
		name     string
		v, least int
	}{{"--pods", o.Pods, 1}, {"--nodes", o.Nodes, 1}, {"--namespaces", o.Namespaces, 1},
		{"--events-per-pod", o.EventsPerPod, 1}, {"--size", o.DataSize, 1}, {"--runs", o.Runs, 1}} {
		if f.v < f.least {
			bad("%s=%d: want at least %d", f.name, f.v, f.least)
		}
	}
	if o.DataSize > 1<<20 {
		bad("--size=%d: want at most 1 MiB", o.DataSize)
	}
	if o.Settle < 0 {
		bad("--settle=%v must be positive", o.Settle)
	}
	if len(o.Layouts) == 0 {
		bad("--layouts is empty; known: %s", strings.Join(AllLayouts, ", "))
	}
	for i, l := range o.Layouts {
		switch {
		case !slices.Contains(AllLayouts, l):
			bad("--layouts: unknown layout %q; known: %s", l, strings.Join(AllLayouts, ", "))
		case slices.Index(o.Layouts, l) < i:
			bad("--layouts: %s named twice", l)
		}
	}
	if len(o.DuplicateWindows) == 0 {
		bad("--duplicate-windows is empty")
	}
	for i, w := range o.DuplicateWindows {
		switch {
		case w != 0 && w < minDuplicateWindow:
			bad("--duplicate-windows: %v is shorter than the %v nats-server accepts (none is 0)", w, minDuplicateWindow)
		case w > streamMaxAge:
			bad("--duplicate-windows: %v is longer than the stream's max age, %v", w, streamMaxAge)
		case slices.Index(o.DuplicateWindows, w) < i:
			bad("--duplicate-windows: %v named twice", w)
		}
	}
	if o.Dir == "" {
		bad("--dir is empty")
	}
	if len(o.ChildCommand) == 0 {
		bad("the command that runs a fleet child is not set")
	}
	return o, errors.Join(errs...)
}

// messages is how many messages each layout's stream gets.
func (o SubjectMemOptions) messages() int { return o.Pods * o.EventsPerPod }

// SubjectMemReport is the outcome of MeasureSubjectMemory.
type SubjectMemReport struct {
	// Options are the measurement's, with defaults filled in.
	Options SubjectMemOptions
	// Baselines are the empty stream's measurements, one a run.
	Baselines []SubjectMemRun
	// Runs are every layout's measurements, in the order made.
	Runs []SubjectMemRun
}

// SubjectMemRun is one measurement: a server on a fresh store, a stream
// filled with the messages in one layout, the server restarted.
type SubjectMemRun struct {
	// Layout is one of AllLayouts; empty for a baseline (no message).
	Layout string
	// DuplicateWindow is the window the stream was created with, as the
	// options give it (0: none).
	DuplicateWindow time.Duration
	// Run counts from 1.
	Run int
	// Subjects, Messages and Bytes are the stream's after the restart.
	Subjects int
	Messages uint64
	Bytes    uint64
	// Ingest is how long the publication took, from the first message to
	// the last ack.
	Ingest time.Duration
	// PeakRSS is the server's VmHWM once every message was acked: its
	// peak from its start through the ingest.
	PeakRSS int64
	// Restart is the time from the SIGTERM until the server, started
	// again on the same store, answered the stream's info.
	Restart time.Duration
	// RestartRSS is the lowest VmRSS sampled over Options.Settle after
	// that answer, LastRSS the last sample.
	RestartRSS, LastRSS int64
}

// MeasureSubjectMemory measures the nats-server's resident memory for the
// same messages published in each layout of opts, on a single server (a
// child process, JetStream file store, one replica, a stream configured
// as the bridge creates it) started on a fresh store, then restarted; and
// the same for an empty stream, the baseline. It blocks until every
// measurement is made, or until ctx is done. It returns an error if a
// server would not start or stop cleanly, or if a stream does not hold
// exactly the messages and subjects its layout makes. Every server it
// started is stopped when it returns; the run directory stays, but the
// stores.
func MeasureSubjectMemory(ctx context.Context, opts SubjectMemOptions) (SubjectMemReport, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return SubjectMemReport{}, err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return SubjectMemReport{}, fmt.Errorf("create run directory: %w", err)
	}
	m := &subjectMem{opts: opts, pods: newPodSet(opts)}
	rep := SubjectMemReport{Options: opts}
	for run := 1; run <= opts.Runs; run++ {
		r, err := m.measure(ctx, "", opts.DuplicateWindows[0], run)
		if err != nil {
			return rep, err
		}
		rep.Baselines = append(rep.Baselines, r)
		for _, w := range opts.DuplicateWindows {
			for _, l := range opts.Layouts {
				r, err := m.measure(ctx, l, w, run)
				if err != nil {
					return rep, err
				}
				rep.Runs = append(rep.Runs, r)
			}
		}
	}
	return rep, nil
}

// subjectMem is one MeasureSubjectMemory call; it is used from its
// goroutine only.
type subjectMem struct {
	opts SubjectMemOptions
	pods podSet
	data []byte // every message's data
}

// podSet is the pods of a measurement, the same in every layout.
type podSet struct {
	opts       SubjectMemOptions
	uids       []string
	nodes      []string
	namespaces []string
}

// newPodSet names the pods, nodes and namespaces of opts. The pod UIDs
// are random (version 4, as the API server makes them) from a fixed seed,
// so that every run stores the same subjects.
func newPodSet(opts SubjectMemOptions) podSet {
	s := podSet{opts: opts}
	r := rand.New(rand.NewPCG(24, 24))
	for range opts.Pods {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		b[6] = b[6]&0x0f | 0x40
		b[8] = b[8]&0x3f | 0x80
		h := hex.EncodeToString(b[:])
		s.uids = append(s.uids, h[0:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:32])
	}
	for i := range opts.Nodes {
		s.nodes = append(s.nodes, fmt.Sprintf("node-%04d", i))
	}
	for i := range opts.Namespaces {
		s.namespaces = append(s.namespaces, fmt.Sprintf("team-%02d", i))
	}
	return s
}

func (s podSet) node(p int) string      { return s.nodes[p%s.opts.Nodes] }
func (s podSet) namespace(p int) string { return s.namespaces[(p/s.opts.Nodes)%s.opts.Namespaces] }

// subject is where layout puts event e of pod p.
func (s podSet) subject(layout string, p, e int) string {
	prefix := schemas.DefaultSubjectPrefix
	typ := string(generator.LifecycleEventTypes[e%len(generator.LifecycleEventTypes)])
	switch layout {
	case LayoutLegacy:
		return prefix + "." + s.node(p) + "." + s.uids[p] + "." + typ
	case LayoutCurrent, LayoutArchive:
		return prefix + "." + s.node(p) + "." + s.namespace(p) + "." + s.uids[p] + "." + typ
	case LayoutPod:
		return prefix + "." + s.node(p) + "." + s.namespace(p) + "." + s.uids[p]
	default:
		return prefix + "." + s.node(p) + "." + s.namespace(p)
	}
}

// msgID is the Nats-Msg-Id of event e of pod p: the bridge's CloudEvent
// id of its type for the pod's container e/3.
func (s podSet) msgID(p, e int) string {
	sum := sha256.Sum256([]byte(s.uids[p] + "/" + strconv.Itoa(e/len(generator.LifecycleEventTypes))))
	return publish.EventID(hex.EncodeToString(sum[:]), generator.LifecycleEventTypes[e%len(generator.LifecycleEventTypes)])
}

// subjects is how many distinct subjects layout makes of the pods' events;
// for LayoutArchive, those of the event stream's kept messages and of the
// archive together.
func (s podSet) subjects(layout string) int {
	if layout == LayoutArchive {
		return s.liveSubjects() + s.archiveSubjects()
	}
	seen := map[string]struct{}{}
	for p := range s.opts.Pods {
		for e := range min(s.opts.EventsPerPod, len(generator.LifecycleEventTypes)) {
			seen[s.subject(layout, p, e)] = struct{}{}
		}
	}
	return len(seen)
}

// keptMessages is how many messages the event stream keeps in
// LayoutArchive.
func (o SubjectMemOptions) keptMessages() int { return max(o.messages()/ArchiveLiveShare, 1) }

// liveSubjects is how many distinct subjects the kept messages of
// LayoutArchive have: the last ones published (publishAll's order).
func (s podSet) liveSubjects() int {
	seen := map[string]struct{}{}
	skip := s.opts.messages() - s.opts.keptMessages()
	i := 0
	for e := range s.opts.EventsPerPod {
		for p := range s.opts.Pods {
			if i >= skip {
				seen[s.subject(LayoutCurrent, p, e)] = struct{}{}
			}
			i++
		}
	}
	return len(seen)
}

// archiveSubjects is how many distinct subjects the archive holds: one per
// node, namespace and event type.
func (s podSet) archiveSubjects() int {
	seen := map[string]struct{}{}
	for p := range s.opts.Pods {
		for e := range min(s.opts.EventsPerPod, len(generator.LifecycleEventTypes)) {
			seen[s.node(p)+"."+s.namespace(p)+"."+string(generator.LifecycleEventTypes[e%len(generator.LifecycleEventTypes)])] = struct{}{}
		}
	}
	return len(seen)
}

// measure makes one measurement of layout ("" for the baseline) with
// duplicate window w in its own directory, whose store it removes after.
func (m *subjectMem) measure(ctx context.Context, layout string, w time.Duration, run int) (SubjectMemRun, error) {
	r := SubjectMemRun{Layout: layout, DuplicateWindow: w, Run: run}
	name := cmp.Or(layout, "baseline")
	dir := filepath.Join(m.opts.Dir, fmt.Sprintf("%s-%s-%d", name, windowName(w), run))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, fmt.Errorf("create %s: %w", dir, err)
	}
	store := filepath.Join(dir, "store")
	defer os.RemoveAll(store)
	srv, url, err := newSingleServer(dir, store, m.opts.ChildCommand)
	if err != nil {
		return r, err
	}
	defer srv.Kill()
	if err := srv.StartReady(ctx, serverReadyTimeout); err != nil {
		return r, err
	}
	var want streamWant
	switch layout {
	case "":
	case LayoutArchive:
		want = streamWant{messages: uint64(m.opts.keptMessages()), subjects: m.pods.liveSubjects(),
			archiveMessages: uint64(m.opts.messages()), archiveSubjects: m.pods.archiveSubjects()}
	default:
		want = streamWant{messages: uint64(m.opts.messages()), subjects: m.pods.subjects(layout)}
	}
	if err := m.fill(ctx, url, layout, w, want, &r); err != nil {
		return r, err
	}
	ps, err := proc.ReadUsage(srv.PID())
	if err != nil {
		return r, err
	}
	r.PeakRSS = ps.PeakRSS

	began := time.Now()
	if err := srv.Stop(proc.Term); err != nil {
		return r, err
	}
	if err := srv.StartReady(ctx, serverReadyTimeout); err != nil {
		return r, err
	}
	nc, js, err := connectOne(url)
	if err != nil {
		return r, err
	}
	defer nc.Close()
	info, err := streamInfo(ctx, js)
	if err != nil {
		return r, fmt.Errorf("after the restart: %w", err)
	}
	r.Restart = time.Since(began)
	r.Subjects, r.Messages, r.Bytes = int(info.State.NumSubjects), info.State.Msgs, info.State.Bytes
	if err := want.check(info, "after the restart"); err != nil {
		return r, err
	}
	if layout == LayoutArchive {
		ainfo, err := archiveInfo(ctx, js)
		if err != nil {
			return r, fmt.Errorf("after the restart: %w", err)
		}
		if err := want.checkArchive(ainfo, "after the restart"); err != nil {
			return r, err
		}
		r.Subjects += int(ainfo.State.NumSubjects)
		r.Messages += ainfo.State.Msgs
		r.Bytes += ainfo.State.Bytes
	}
	if r.RestartRSS, r.LastRSS, err = lowestRSS(ctx, srv.PID(), m.opts.Settle); err != nil {
		return r, err
	}
	nc.Close()
	if err := srv.Stop(proc.Term); err != nil {
		return r, err
	}
	m.progress(r)
	return r, nil
}

// fill creates the stream as the bridge does, with duplicate window w,
// and publishes every message in layout (none for the baseline), each
// pod's first event, then each pod's second, and so on, so that a pod's
// events lie apart in the stream as they do in time. It waits for every
// ack and checks that the stream holds what it should.
func (m *subjectMem) fill(ctx context.Context, url, layout string, w time.Duration, want streamWant, r *SubjectMemRun) error {
	nc, js, err := connectOne(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	sctx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
	_, err = publish.EnsureStream(sctx, js, publish.StreamOptions{
		Name: streamName, SubjectPrefix: schemas.DefaultSubjectPrefix, Replicas: 1, MaxAge: streamMaxAge,
		DuplicateWindow: cmp.Or(w, minDuplicateWindow),
	})
	cancel()
	if err != nil {
		return err
	}
	if layout == LayoutArchive {
		actx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
		_, err = publish.EnsureArchive(actx, js, publish.ArchiveOptions{
			Stream: streamName, SubjectPrefix: schemas.DefaultSubjectPrefix, Replicas: 1,
			MaxAge: ArchiveLiveShare * streamMaxAge, DuplicateWindow: cmp.Or(w, minDuplicateWindow),
		})
		cancel()
		if err != nil {
			return err
		}
	}
	if layout != "" {
		if m.data == nil {
			m.data = messageData(m.opts.DataSize)
		}
		began := time.Now()
		if err := m.publishAll(ctx, js, layout); err != nil {
			return err
		}
		r.Ingest = time.Since(began)
	}
	if layout == LayoutArchive {
		if err := m.cutToTheLiveShare(ctx, js, want); err != nil {
			return err
		}
	}
	info, err := streamInfo(ctx, js)
	if err != nil {
		return err
	}
	return want.check(info, "after the ingest")
}

// cutToTheLiveShare waits until the archive holds every message, then
// purges the event stream to its last ArchiveLiveShare, as its shorter max
// age would.
func (m *subjectMem) cutToTheLiveShare(ctx context.Context, js jetstream.JetStream, want streamWant) error {
	deadline := time.Now().Add(streamCurrentTimeout)
	for {
		info, err := archiveInfo(ctx, js)
		if err != nil {
			return err
		}
		if info.State.Msgs >= want.archiveMessages {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the archive holds %d of %d messages after %v", info.State.Msgs, want.archiveMessages, streamCurrentTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	s, err := js.Stream(ctx, streamName)
	if err != nil {
		return err
	}
	if err := s.Purge(ctx, jetstream.WithPurgeKeep(want.messages)); err != nil {
		return fmt.Errorf("cut stream %s to its last %d messages: %w", streamName, want.messages, err)
	}
	return nil
}

// archiveInfo returns the archive stream's info.
func archiveInfo(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, schemas.ArchiveName(streamName))
	if err != nil {
		return nil, fmt.Errorf("look up the archive of %s: %w", streamName, err)
	}
	return s.Info(ctx)
}

// publishAll publishes the messages of layout asynchronously with at most
// publishWindow awaiting their ack. A publication that fails is made
// again, synchronously, with the same Nats-Msg-Id.
func (m *subjectMem) publishAll(ctx context.Context, js jetstream.JetStream, layout string) error {
	inFlight := make([]jetstream.PubAckFuture, 0, publishWindow)
	await := func(f jetstream.PubAckFuture) error {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			if _, err2 := js.PublishMsg(ctx, f.Msg()); err2 != nil {
				return fmt.Errorf("publish to %s: %w (again: %w)", f.Msg().Subject, err, err2)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for e := range m.opts.EventsPerPod {
		for p := range m.opts.Pods {
			if len(inFlight) == publishWindow {
				if err := await(inFlight[0]); err != nil {
					return err
				}
				inFlight = append(inFlight[:0], inFlight[1:]...)
			}
			msg := &nats.Msg{
				Subject: m.pods.subject(layout, p, e),
				Header:  nats.Header{jetstream.MsgIDHeader: {m.pods.msgID(p, e)}, "Content-Type": {contentType}},
				Data:    m.data,
			}
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				return fmt.Errorf("publish to %s: %w", msg.Subject, err)
			}
			inFlight = append(inFlight, f)
		}
	}
	for _, f := range inFlight {
		if err := await(f); err != nil {
			return err
		}
	}
	return nil
}

// streamWant is what a measurement's stream, and archive if any, must
// hold.
type streamWant struct {
	messages        uint64
	subjects        int
	archiveMessages uint64
	archiveSubjects int
}

func (w streamWant) checkArchive(info *jetstream.StreamInfo, when string) error {
	if info.State.Msgs != w.archiveMessages || int(info.State.NumSubjects) != w.archiveSubjects {
		return fmt.Errorf("archive of %s %s: %d messages on %d subjects, want %d on %d",
			streamName, when, info.State.Msgs, info.State.NumSubjects, w.archiveMessages, w.archiveSubjects)
	}
	return nil
}

func (w streamWant) check(info *jetstream.StreamInfo, when string) error {
	if info.State.Msgs != w.messages || int(info.State.NumSubjects) != w.subjects {
		return fmt.Errorf("stream %s %s: %d messages on %d subjects, want %d on %d",
			streamName, when, info.State.Msgs, info.State.NumSubjects, w.messages, w.subjects)
	}
	return nil
}

// progress prints one line about r.
func (m *subjectMem) progress(r SubjectMemRun) {
	name := cmp.Or(r.Layout, "baseline")
	rate := "-"
	if r.Ingest > 0 {
		rate = fmt.Sprintf("%.0f/s", float64(r.Messages)/r.Ingest.Seconds())
	}
	fmt.Fprintf(m.opts.Stdout, "run %d  %-14s  window %-5s  %d messages, %d subjects, %s (%s a message); ingest %v (%s), peak RSS %s; restarted in %v; RSS after restart %s (lowest of %v), %s at the end\n",
		r.Run, name, windowName(r.DuplicateWindow), r.Messages, r.Subjects, mib(int64(r.Bytes)), perMessage(r.Bytes, r.Messages),
		roundDelay(r.Ingest), rate, mib(r.PeakRSS), roundDelay(r.Restart), mib(r.RestartRSS), m.opts.Settle, mib(r.LastRSS))
}

// newSingleServer describes one nats-server, no cluster, JetStream on
// store, its log in dir; it does not run yet.
func newSingleServer(dir, store string, command []string) (*proc.Process, string, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, "", err
	}
	spec := &serverSpec{Name: "subjects", ClientPort: ports[0], StoreDir: store}
	p, err := newProcess("nats-server", command, childSpec{Role: roleServer, Server: spec}, filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, "", err
	}
	return p, "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), nil
}

// connectOne connects a client to a single server, without reconnecting:
// each server incarnation gets its own client.
func connectOne(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name("pleg-bridge fleet subjects"), nats.NoReconnect())
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("create JetStream context: %w", err)
	}
	return nc, js, nil
}

func streamInfo(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, error) {
	ictx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
	defer cancel()
	s, err := js.Stream(ictx, streamName)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", streamName, err)
	}
	info, err := s.Info(ictx)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", streamName, err)
	}
	return info, nil
}

// lowestRSS samples process pid's VmRSS every sampleEvery for settle and
// returns the lowest sample and the last. The Go runtime of the server
// gives freed memory back to the system over seconds, and nothing outside
// the process can make it collect now: the lowest is the nearest to what
// the server keeps.
func lowestRSS(ctx context.Context, pid int, settle time.Duration) (lowest, last int64, err error) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	end := time.Now().Add(settle)
	for {
		s, err := proc.ReadUsage(pid)
		if err != nil {
			return 0, 0, err
		}
		last = s.RSS
		if lowest == 0 || last < lowest {
			lowest = last
		}
		if !time.Now().Before(end) {
			return lowest, last, nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-t.C:
		}
	}
}

// messageData returns n bytes of JSON, a stand-in for a CloudEvent: the
// server neither reads nor compresses it.
func messageData(n int) []byte {
	const head, tail = `{"pad":"`, `"}`
	if n < len(head)+len(tail) {
		return []byte(strings.Repeat(" ", n))
	}
	return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
}

// windowName is a duplicate window for people: "2m", "100ms", "none".
func windowName(w time.Duration) string {
	if w == 0 {
		return "none"
	}
	s := w.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Table writes the report: the baseline, then one row per layout and
// duplicate window with the ranges over the runs.
func (r SubjectMemReport) Table(w io.Writer) error {
	o := r.Options
	var b strings.Builder
	fmt.Fprintf(&b, "subject memory: %d pods of %d events over %d nodes and %d namespaces, %d messages of %d bytes of data; one nats-server (a process of its own), JetStream file store, 1 replica; each figure over %d runs\n",
		o.Pods, o.EventsPerPod, o.Nodes, o.Namespaces, o.messages(), o.DataSize, o.Runs)
	var base []int64
	for _, m := range r.Baselines {
		base = append(base, m.RestartRSS)
	}
	baseline := mean(base)
	fmt.Fprintf(&b, "baseline (an empty stream, after a restart): %s; the per-subject and per-pod figures are over its mean, %s\n\n",
		mibRange(base), mib(baseline))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layout\tsubject\tdup window\tsubjects\tmessages\tbytes a message\tRSS after restart\tper subject over baseline\tper pod over baseline\tpeak RSS in ingest\trestart\t")
	for _, win := range o.DuplicateWindows {
		for _, l := range o.Layouts {
			var rss, peak, perSubject, perPod []int64
			var restart []time.Duration
			subjects, msgs, bytes := -1, uint64(0), uint64(0)
			for _, m := range r.Runs {
				if m.Layout != l || m.DuplicateWindow != win {
					continue
				}
				rss = append(rss, m.RestartRSS)
				peak = append(peak, m.PeakRSS)
				restart = append(restart, m.Restart)
				if m.Subjects > 0 {
					perSubject = append(perSubject, (m.RestartRSS-baseline)/int64(m.Subjects))
				}
				perPod = append(perPod, (m.RestartRSS-baseline)/int64(o.Pods))
				subjects, msgs, bytes = m.Subjects, m.Messages, m.Bytes
			}
			if len(rss) == 0 {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
				l, layoutPattern[l], windowName(win), subjects, msgs, perMessage(bytes, msgs),
				mibRange(rss), bytesRange(perSubject), bytesRange(perPod), mibRange(peak), delayRange(restart))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&b, "(RSS after restart: the lowest VmRSS sampled every %v for %v after the restarted server answered the stream's info; peak: VmHWM once every message was acked;\n"+
		" restart: from the SIGTERM to the restarted server's answer; dup window none: the server's least, %v. A restarted server reloads the ids of the messages\n"+
		" stored within the duplicate window before it, here every message whose ingest and restart took less than the window: those rows hold the ids too)\n",
		sampleEvery, o.Settle, minDuplicateWindow)
	_, err := io.WriteString(w, b.String())
	return err
}

func mean(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	var s int64
	for _, x := range v {
		s += x
	}
	return s / int64(len(v))
}

// rangeOf formats the lowest and highest of v with f, once if they are
// the same.
func rangeOf[T cmp.Ordered](v []T, f func(T) string) string {
	if len(v) == 0 {
		return "-"
	}
	lo, hi := slices.Min(v), slices.Max(v)
	if f(lo) == f(hi) {
		return f(lo)
	}
	return strings.TrimSuffix(f(lo), unitOf(f(lo))) + "–" + f(hi)
}

// unitOf returns the unit suffix of a formatted figure (" MiB", " B",
// "s"), so that a range names it once.
func unitOf(s string) string {
	for _, u := range []string{" MiB", " B"} {
		if strings.HasSuffix(s, u) {
			return u
		}
	}
	return ""
}

func mibRange(v []int64) string { return rangeOf(v, mib) }

func bytesRange(v []int64) string {
	return rangeOf(v, func(n int64) string { return fmt.Sprintf("%d B", n) })
}

func delayRange(v []time.Duration) string {
	return rangeOf(v, func(d time.Duration) string { return roundDelay(d).String() })
}
