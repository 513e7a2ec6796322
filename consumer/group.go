package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// ErrGroupChanged is returned by Consume when the group's work stream
// exists with another source stream, filter or partition count than the
// options ask for. A group keeps these for its whole life: delete the work
// stream (DurableOptions.WorkStream) to start the group afresh.
var ErrGroupChanged = errors.New("durable group exists with another source, filter or partition count")

// partitionTransform returns the subject transform that the group's work
// stream applies while it sources the event stream's current layout. Its
// source is the five-token event subject
// <prefix>.<node>.<namespace>.<pod>.<type> with the filter's values as
// literal tokens and "*" elsewhere, so the server copies only the matching
// events. Its destination is "<partition>." followed by the same tokens,
// where <partition> is the server's hash of the pod token modulo
// partitions: every event of one pod lands in one partition. A filter on
// one pod puts everything in partition 0.
func partitionTransform(prefix string, f Filter, partitions int) (jetstream.SubjectTransformConfig, error) {
	typ, err := groupFilter(prefix, f)
	if err != nil {
		return jetstream.SubjectTransformConfig{}, err
	}
	return transformOf(prefix, []string{f.Node, f.Namespace, f.PodUID, typ}, 2, partitions), nil
}

// legacyPartitionTransform is partitionTransform for the legacy layout,
// <prefix>.<node>.<pod>.<type>: the transform every group had before the
// namespace token, so that a group made then is recognised. It cannot
// select a namespace: the group's members check it on each event.
func legacyPartitionTransform(prefix string, f Filter, partitions int) (jetstream.SubjectTransformConfig, error) {
	typ, err := groupFilter(prefix, f)
	if err != nil {
		return jetstream.SubjectTransformConfig{}, err
	}
	return transformOf(prefix, []string{f.Node, f.PodUID, typ}, 1, partitions), nil
}

// groupFilter checks what a group's transform needs: the prefix, the type
// (returned as a Lifecycle event type, "" for any) and the namespace.
func groupFilter(prefix string, f Filter) (string, error) {
	if err := schemas.ValidatePrefix(prefix); err != nil {
		return "", fmt.Errorf("subject prefix: %w", err)
	}
	if err := f.validate(); err != nil {
		return "", err
	}
	return lifecycleType(f.Type)
}

// transformOf builds a partitioning transform over the subject tokens after
// prefix: values holds the raw filter values ("" for any), pod is the index
// of the pod UID token.
func transformOf(prefix string, values []string, pod, partitions int) jetstream.SubjectTransformConfig {
	src := []string{prefix}
	dst := []string{prefix}
	partition := "0"
	wildcard := 0
	for i, v := range values {
		if v != "" {
			lit := v
			if i != len(values)-1 { // the type is not encoded
				lit = schemas.EncodeToken(v)
			}
			src, dst = append(src, lit), append(dst, lit)
			continue
		}
		wildcard++
		src = append(src, "*")
		dst = append(dst, "{{wildcard("+strconv.Itoa(wildcard)+")}}")
		if i == pod {
			partition = "{{partition(" + strconv.Itoa(partitions) + "," + strconv.Itoa(wildcard) + ")}}"
		}
	}
	return jetstream.SubjectTransformConfig{
		Source:      strings.Join(src, "."),
		Destination: partition + "." + strings.Join(dst, "."),
	}
}

// partitionFilter is the filter subject of partition k's consumer.
func partitionFilter(k int) string { return strconv.Itoa(k) + ".>" }

// partitionConsumerName is the durable name of partition k's consumer.
func partitionConsumerName(group string, k int) string { return group + "-" + strconv.Itoa(k) }

// workStreamSource returns the source of the group's work stream: the
// event stream through two transforms, one per subject layout (legacy,
// then current), starting where the options say when the work stream is
// created. One source, so that the server copies the events in the event
// stream's order, a pod's events in a legacy then in the current layout
// included.
//
// The start is always a sequence: the server starts a source without one
// at the work stream's last message time.
func (o DurableOptions) workStreamSource(ctx context.Context, js jetstream.JetStream, legacy, current jetstream.SubjectTransformConfig) (*jetstream.StreamSource, error) {
	var start uint64
	switch {
	case !o.StartTime.IsZero():
		seq, err := firstSince(ctx, js, o.stream(), o.subjectPrefix()+".>", o.StartTime)
		if err != nil {
			return nil, err
		}
		start = seq
	case o.DeliverAll:
		start = 1
	default:
		stream, err := js.Stream(ctx, o.stream())
		if err != nil {
			return nil, fmt.Errorf("look up stream %s: %w", o.stream(), err)
		}
		start = stream.CachedInfo().State.LastSeq + 1
	}
	return &jetstream.StreamSource{
		Name:              o.stream(),
		OptStartSeq:       start,
		SubjectTransforms: []jetstream.SubjectTransformConfig{legacy, current},
	}, nil
}

// ensureGroup creates the group's work stream if it does not exist, checks
// it if it does, creates or updates one durable consumer per partition and
// returns them, partition k at index k.
func ensureGroup(ctx context.Context, js jetstream.JetStream, o DurableOptions) ([]jetstream.Consumer, error) {
	current, err := partitionTransform(o.subjectPrefix(), o.Filter, o.Partitions)
	if err != nil {
		return nil, err
	}
	legacy, err := legacyPartitionTransform(o.subjectPrefix(), o.Filter, o.Partitions)
	if err != nil {
		return nil, err
	}
	name := o.WorkStream()
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = createWorkStream(ctx, js, o, legacy, current)
	}
	if err != nil {
		return nil, fmt.Errorf("look up work stream %s of group %s: %w", name, o.Name, err)
	}
	upgrade, err := checkWorkStream(stream.CachedInfo().Config, o.stream(), legacy, current)
	if err != nil {
		return nil, fmt.Errorf("group %s: work stream %s: %w", o.Name, name, err)
	}
	if upgrade {
		if stream, err = upgradeWorkStream(ctx, js, stream, o.stream(), current); err != nil {
			return nil, fmt.Errorf("group %s: work stream %s: add the current subject layout: %w", o.Name, name, err)
		}
	}

	conss := make([]jetstream.Consumer, o.Partitions)
	for k := range conss {
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       partitionConsumerName(o.Name, k),
			Description:   fmt.Sprintf("pleg-bridge group %s, partition %d of %d", o.Name, k, o.Partitions),
			FilterSubject: partitionFilter(k),
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       o.AckWait,
			// Consume counts deliveries itself, so that the last one is
			// reported even when a crash interrupted it.
			MaxDeliver: -1,
			// One event of a partition at a time, among all members: this is
			// what keeps each pod's events in order.
			MaxAckPending: 1,
			Replicas:      o.Replicas,
		})
		if err != nil {
			return nil, fmt.Errorf("create consumer %s on work stream %s: %w", partitionConsumerName(o.Name, k), name, err)
		}
		conss[k] = cons
	}
	return conss, nil
}

// createWorkStream creates the group's work stream. If another member
// created it meanwhile, it returns that one.
func createWorkStream(ctx context.Context, js jetstream.JetStream, o DurableOptions, legacy, current jetstream.SubjectTransformConfig) (jetstream.Stream, error) {
	src, err := o.workStreamSource(ctx, js, legacy, current)
	if err != nil {
		return nil, err
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: o.WorkStream(),
		Description: fmt.Sprintf("pleg-bridge group %s: events of %s in %d partitions by pod UID",
			o.Name, o.stream(), o.Partitions),
		Sources: []*jetstream.StreamSource{src},
		// An event leaves the work stream once its partition's consumer
		// acks it, so the stream holds the group's backlog, not a copy of
		// the history.
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  o.Replicas,
		// The server drops a sourced message whose Nats-Msg-Id (the
		// CloudEvent id) it copied within this window: a repeat a bridge
		// published after the servers lost the event never reaches the
		// group, whichever member handled the first copy. A stream with a
		// source has no window unless it is set.
		Duplicates: o.Repeats.workStreamWindow(),
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, o.WorkStream())
	}
	return stream, err
}

// checkWorkStream reports ErrGroupChanged if cfg is not a work queue with
// one source, origin through legacy and current. A work stream made before
// the namespace token, whose source has the legacy transform only, is
// accepted with upgrade true.
func checkWorkStream(cfg jetstream.StreamConfig, origin string, legacy, current jetstream.SubjectTransformConfig) (upgrade bool, err error) {
	if cfg.Retention != jetstream.WorkQueuePolicy || len(cfg.Sources) != 1 || cfg.Sources[0] == nil {
		return false, fmt.Errorf("%w: it is not a work queue with one source", ErrGroupChanged)
	}
	src := cfg.Sources[0]
	want := []jetstream.SubjectTransformConfig{legacy, current}
	if src.Name == origin && slices.Equal(src.SubjectTransforms, want[:1]) {
		return true, nil
	}
	if src.Name != origin || !slices.Equal(src.SubjectTransforms, want) && !slices.Equal(src.SubjectTransforms, []jetstream.SubjectTransformConfig{current, legacy}) {
		return false, fmt.Errorf("%w: it sources %s through %+v, want %s through %+v",
			ErrGroupChanged, src.Name, src.SubjectTransforms, origin, want)
	}
	return false, nil
}

// upgradeWorkStream gives the source of a work stream made before the
// namespace token the current layout's transform too. The server treats a
// source with other transforms as a new one, so the update says where it
// starts: after the last event the old source copied, or at the first
// event of the current layout stored since the group was made if that is
// earlier (the old transform could not copy those). In the second case
// the legacy events between the two are copied again: the group receives
// them at least once, as after a crash, never not at all.
func upgradeWorkStream(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, origin string, current jetstream.SubjectTransformConfig) (jetstream.Stream, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	start, err := firstSince(ctx, js, origin, current.Source, info.Created)
	if err != nil {
		return nil, err
	}
	if len(info.Sources) == 1 && info.Sources[0].Seq > 0 {
		start = min(start, info.Sources[0].Seq+1)
	} else {
		// The old source has not reported how far it got: from the
		// group's creation.
		all, err := firstSince(ctx, js, origin, ">", info.Created)
		if err != nil {
			return nil, err
		}
		start = min(start, all)
	}
	cfg := info.Config
	src := *cfg.Sources[0]
	src.OptStartSeq, src.OptStartTime = start, nil
	src.SubjectTransforms = append(slices.Clone(src.SubjectTransforms), current)
	cfg.Sources = []*jetstream.StreamSource{&src}
	return js.UpdateStream(ctx, cfg)
}

// firstSince returns the sequence of the first message on subject that
// stream stored at or after t, or the sequence after its last message if
// there is none.
func firstSince(ctx context.Context, js jetstream.JetStream, stream, subject string, t time.Time) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("look up stream %s: %w", stream, err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &t,
	})
	if err != nil {
		return 0, fmt.Errorf("find the first message on %s since %s: %w", subject, t.Format(time.RFC3339), err)
	}
	defer deleteConsumer(ctx, js, stream, cons)
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		return s.CachedInfo().State.LastSeq + 1, nil
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(ackTimeout))
	if err != nil {
		return 0, fmt.Errorf("find the first message on %s since %s: %w", subject, t.Format(time.RFC3339), err)
	}
	meta, err := msg.Metadata()
	if err != nil {
		return 0, fmt.Errorf("find the first message on %s since %s: %w", subject, t.Format(time.RFC3339), err)
	}
	return meta.Sequence.Stream, nil
}

// sourceHeader is the header in which JetStream records where a sourced
// message came from: "<stream> <sequence> <filter> <transform> <subject>".
const sourceHeader = "Nats-Stream-Source"

// origin returns the stream sequence and the subject a work stream message
// had in the event stream.
func origin(msg jetstream.Msg, stream string) (seq uint64, subject string, err error) {
	h := msg.Headers().Get(sourceHeader)
	fields := strings.Split(h, " ")
	if len(fields) < 5 || fields[0] != stream {
		return 0, "", fmt.Errorf("header %s %q does not name a message of stream %s", sourceHeader, h, stream)
	}
	seq, err = strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("header %s %q: sequence: %w", sourceHeader, h, err)
	}
	return seq, fields[4], nil
}
