package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Options say which events Subscribe and Replay deliver. The zero value
// follows every event published from now on to the default stream.
type Options struct {
	// Stream is the JetStream stream name: if empty, schemas.DefaultStream,
	// or its archive's (ArchiveStream) with Archive.
	Stream string
	// Archive says Stream is an archive stream (PLEG_ARCHIVE_MAX_AGE):
	// its subjects carry "%" for the pod UID (and, for events of the legacy
	// layout, for the namespace too), so the filter subject never names a
	// pod (Filter.ArchiveSubject) and a pod filter is checked in the client,
	// after the server's node, namespace and type filters. Legacy then
	// says whether a namespace filter also reads the archived legacy
	// events (Filter.ArchiveLegacySubject).
	Archive bool
	// SubjectPrefix is the first token of every subject,
	// schemas.DefaultSubjectPrefix if empty.
	SubjectPrefix string
	Filter        Filter
	// Legacy says whether to read, besides the current subject layout,
	// the events of the legacy one, which bridges before the namespace
	// token wrote: LegacyAuto (the zero value) if the stream holds any that
	// the filter may select (see Filter.LegacySubject).
	Legacy LegacyMode
	// StartTime, if set, starts at the first message the stream stored at or
	// after it. Times are JetStream's storage times, which trail the events'
	// own times by the publishing delay.
	StartTime time.Time
	// EndTime, for Replay only, stops before the first message stored after
	// it.
	EndTime time.Time
	// StartSeq, if set, starts at this stream sequence, or at the first
	// matching message after it. It cannot be combined with StartTime or
	// DeliverAll.
	StartSeq uint64
	// DeliverAll starts at the beginning of the stream. It cannot be
	// combined with StartTime. Replay always does this without StartTime.
	DeliverAll bool
	// OnCaughtUp, if set, is called once by Subscribe when it has handed fn
	// every matching message stored before it started: at once if there is
	// none, else after fn returns for the message that leaves nothing
	// pending. Messages that keep arriving can delay it. It is called from
	// the goroutine that called Subscribe. Replay ignores it.
	OnCaughtUp func()
	// OnError, if set, is called with a *DecodeError for each message that
	// is not a pleg-bridge event; the message is skipped either way. It is
	// called from the goroutine that called Subscribe or Replay.
	OnError func(error)
	// Repeats say how an event delivered before, which the stream holds
	// again at a later sequence with the same id (the bridges published it
	// again after the servers lost it), is recognised and dropped. The
	// zero value drops repeats within DefaultRepeatWindow.
	Repeats RepeatOptions
	// RollbackCheck is how often Subscribe checks that the stream still
	// holds the last message it read (one get of that message), to
	// notice a stream whose servers came back with an older store:
	// DefaultRollbackCheck if zero. It also checks
	// at once after a reconnect and whenever nats.go recreates its
	// consumer. Replay ignores it.
	RollbackCheck time.Duration
	// OnRollback, if set, is called once for each rollback Subscribe
	// noticed and read again after (Rollback): log it. It is called from
	// the goroutine that called Subscribe. Replay ignores it.
	OnRollback func(Rollback)
}

// LegacyMode says whether Subscribe and Replay read the events of the
// legacy subject layout, <prefix>.<node>.<podUID>.<eventType>. It matters
// only for a filter on a namespace, a pod or a type: a filter on nothing or
// on a node selects both layouts with one subject anyway.
type LegacyMode int

const (
	// LegacyAuto reads them if the stream holds a message that the legacy
	// filter subject matches: one get of a message by subject, bounded by
	// legacyProbeTimeout. A reader that may not make that request (one
	// limited to namespaces: a legacy subject carries no namespace to limit
	// it by) reads the current layout only; the server reports the refusal
	// on the connection's error handler.
	LegacyAuto LegacyMode = iota
	// LegacyNever reads the current layout only, without asking.
	LegacyNever
	// LegacyAlways reads both without asking: a consumer with two filter
	// subjects, which a reader limited to namespaces may not create.
	LegacyAlways
)

// legacyProbeTimeout bounds LegacyAuto's request: the server answers it
// from its subject index, or refuses it without a reply, which only the
// timeout ends.
const legacyProbeTimeout = time.Second

// DecodeError reports a message in the stream that could not be decoded.
type DecodeError struct {
	NATSSubject string
	Sequence    uint64
	Err         error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("message %d on %s: %v", e.Sequence, e.NATSSubject, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// consumerConfig validates the options and returns the ordered consumer
// configuration, with deliverPolicy used when neither StartTime nor
// DeliverAll is set. Its filter subjects are the filter's subject and, if
// stream holds events of the legacy layout that the filter may select
// (legacySubjects), the legacy filter subject too.
func (o Options) consumerConfig(ctx context.Context, stream streamLookup, deliverPolicy jetstream.DeliverPolicy) (jetstream.OrderedConsumerConfig, error) {
	subject, err := o.filterSubject()
	if err != nil {
		return jetstream.OrderedConsumerConfig{}, err
	}
	if err := o.Filter.validate(); err != nil {
		return jetstream.OrderedConsumerConfig{}, err
	}
	if o.DeliverAll && !o.StartTime.IsZero() {
		return jetstream.OrderedConsumerConfig{}, errors.New("options DeliverAll and StartTime cannot be combined")
	}
	if o.StartSeq != 0 && (o.DeliverAll || !o.StartTime.IsZero()) {
		return jetstream.OrderedConsumerConfig{}, errors.New("option StartSeq cannot be combined with StartTime or DeliverAll")
	}
	if err := o.Repeats.validate(); err != nil {
		return jetstream.OrderedConsumerConfig{}, err
	}
	if !o.EndTime.IsZero() && o.EndTime.Before(o.StartTime) {
		return jetstream.OrderedConsumerConfig{}, fmt.Errorf("end time %s is before start time %s",
			o.EndTime.Format(time.RFC3339Nano), o.StartTime.Format(time.RFC3339Nano))
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  deliverPolicy,
	}
	legacy, err := o.legacySubject()
	if err != nil {
		return jetstream.OrderedConsumerConfig{}, err
	}
	if legacy != "" && (o.Legacy == LegacyAlways || o.Legacy == LegacyAuto && legacyEvents(ctx, stream, legacy)) {
		cfg.FilterSubjects = append(cfg.FilterSubjects, legacy)
	}
	switch {
	case o.StartSeq != 0:
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = o.StartSeq
	case !o.StartTime.IsZero():
		start := o.StartTime
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &start
	case o.DeliverAll:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	return cfg, nil
}

// legacyEvents reports whether stream holds a message on a subject that
// matches legacy, the filter of the subject layout without the namespace
// token: one request, a get of the first such message, which the server
// answers from its subject index. Only then does a consumer need the second
// filter subject, and so only then does it need the permission to read
// beyond its namespace: a reader whose permissions are limited to
// namespaces, which cannot make that request, reads the current layout only
// (a stream still holding legacy events is for readers of the whole
// stream), after legacyProbeTimeout.
func legacyEvents(ctx context.Context, stream streamLookup, legacy string) bool {
	ctx, cancel := context.WithTimeout(ctx, legacyProbeTimeout)
	defer cancel()
	s, err := stream(ctx)
	if err != nil {
		return false
	}
	_, err = s.GetMsg(ctx, max(s.CachedInfo().State.FirstSeq, 1), jetstream.WithGetMsgSubject(legacy))
	return err == nil
}

// LegacyProbeRefused reports whether err, as a connection's error handler
// receives it, is the server refusing LegacyAuto's probe of stream (a get of
// a message by subject, which a reader limited to namespaces may not make),
// or Subscribe's rollback check (a get of a message by sequence, the same
// request). Subscribe and Replay survive that refusal, reading the current
// layout only and checking the stream's last sequence only, so an error
// handler that ends the connection on a permission violation should let
// this one pass. The server reports it only as text,
// naming the API subject refused, so this is where that text is read.
func LegacyProbeRefused(err error, stream string) bool {
	if err == nil || stream == "" {
		return false
	}
	s := err.Error()
	return strings.Contains(s, `"$JS.API.STREAM.MSG.GET.`+stream+`"`) || strings.Contains(s, `"$JS.API.DIRECT.GET.`+stream+`"`)
}

// streamLookup returns the stream a call reads, looked up once (lookupOnce).
type streamLookup func(context.Context) (jetstream.Stream, error)

// lookupOnce returns a streamLookup of the stream name that asks the server
// for its info at the first call that succeeds, and not again.
func lookupOnce(js jetstream.JetStream, name string) streamLookup {
	var s jetstream.Stream
	return func(ctx context.Context) (jetstream.Stream, error) {
		if s != nil {
			return s, nil
		}
		var err error
		s, err = js.Stream(ctx, name)
		return s, err
	}
}

// filterSubject is the filter's subject in the stream read.
func (o Options) filterSubject() (string, error) {
	if o.Archive {
		return o.Filter.ArchiveSubject(o.subjectPrefix())
	}
	return o.Filter.Subject(o.subjectPrefix())
}

// legacySubject is the filter subject of the legacy events the filter
// may select in the stream read, "" if filterSubject selects them.
func (o Options) legacySubject() (string, error) {
	if o.Archive {
		return o.Filter.ArchiveLegacySubject(o.subjectPrefix())
	}
	return o.Filter.LegacySubject(o.subjectPrefix())
}

func (o Options) stream() string {
	if o.Stream == "" && o.Archive {
		return schemas.ArchiveName(schemas.DefaultStream)
	}
	return cmp.Or(o.Stream, schemas.DefaultStream)
}
func (o Options) subjectPrefix() string { return cmp.Or(o.SubjectPrefix, schemas.DefaultSubjectPrefix) }

// decode decodes msg, reporting a message that is not a pleg-bridge event
// to OnError. ok is false for such a message, and for an event that does
// not match the filter (Filter.Matches: the fields the server cannot
// check).
func (o Options) decode(msg jetstream.Msg) (e Event, ok bool) {
	e, err := DecodeMsg(msg)
	if err == nil {
		return e, o.Filter.Matches(e)
	}
	if o.OnError != nil {
		de := &DecodeError{NATSSubject: msg.Subject(), Err: err}
		if meta, merr := msg.Metadata(); merr == nil {
			de.Sequence = meta.Sequence.Stream
		}
		o.OnError(de)
	}
	return Event{}, false
}
