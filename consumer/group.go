package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// ErrGroupChanged is returned by Consume when the group's work stream
// exists with another source stream, filter or partition count than the
// options ask for. A group keeps these for its whole life: delete the work
// stream (DurableOptions.WorkStream) to start the group afresh.
var ErrGroupChanged = errors.New("durable group exists with another source, filter or partition count")

// partitionTransform returns the subject transform that the group's work
// stream applies while it sources the event stream. Its source is the
// four-token event subject <prefix>.<node>.<pod>.<type> with the filter's
// values as literal tokens and "*" elsewhere, so the server copies only the
// matching events. Its destination is "<partition>." followed by the same
// four tokens, where <partition> is the server's hash of the pod token
// modulo partitions: every event of one pod lands in one partition. A
// filter on one pod puts everything in partition 0.
func partitionTransform(prefix string, f Filter, partitions int) (jetstream.SubjectTransformConfig, error) {
	if err := schemas.ValidatePrefix(prefix); err != nil {
		return jetstream.SubjectTransformConfig{}, fmt.Errorf("subject prefix: %w", err)
	}
	typ, err := lifecycleType(f.Type)
	if err != nil {
		return jetstream.SubjectTransformConfig{}, err
	}
	literal := [3]string{}
	if f.Node != "" {
		literal[0] = schemas.EncodeToken(f.Node)
	}
	if f.PodUID != "" {
		literal[1] = schemas.EncodeToken(f.PodUID)
	}
	literal[2] = typ

	src := []string{prefix}
	dst := []string{prefix}
	partition := "0"
	wildcard := 0
	for i, lit := range literal {
		if lit != "" {
			src, dst = append(src, lit), append(dst, lit)
			continue
		}
		wildcard++
		src = append(src, "*")
		dst = append(dst, "{{wildcard("+strconv.Itoa(wildcard)+")}}")
		if i == 1 {
			partition = "{{partition(" + strconv.Itoa(partitions) + "," + strconv.Itoa(wildcard) + ")}}"
		}
	}
	return jetstream.SubjectTransformConfig{
		Source:      strings.Join(src, "."),
		Destination: partition + "." + strings.Join(dst, "."),
	}, nil
}

// partitionFilter is the filter subject of partition k's consumer.
func partitionFilter(k int) string { return strconv.Itoa(k) + ".>" }

// partitionConsumerName is the durable name of partition k's consumer.
func partitionConsumerName(group string, k int) string { return group + "-" + strconv.Itoa(k) }

// workStreamSource returns the source of the group's work stream, starting
// where the options say when the work stream is created.
func (o DurableOptions) workStreamSource(ctx context.Context, js jetstream.JetStream, tr jetstream.SubjectTransformConfig) (jetstream.StreamSource, error) {
	src := jetstream.StreamSource{
		Name:              o.stream(),
		SubjectTransforms: []jetstream.SubjectTransformConfig{tr},
	}
	switch {
	case !o.StartTime.IsZero():
		start := o.StartTime
		src.OptStartTime = &start
	case o.DeliverAll:
		// A source without a start position copies from the first message.
	default:
		stream, err := js.Stream(ctx, o.stream())
		if err != nil {
			return jetstream.StreamSource{}, fmt.Errorf("look up stream %s: %w", o.stream(), err)
		}
		src.OptStartSeq = stream.CachedInfo().State.LastSeq + 1
	}
	return src, nil
}

// ensureGroup creates the group's work stream if it does not exist, checks
// it if it does, creates or updates one durable consumer per partition and
// returns them, partition k at index k.
func ensureGroup(ctx context.Context, js jetstream.JetStream, o DurableOptions) ([]jetstream.Consumer, error) {
	tr, err := partitionTransform(o.subjectPrefix(), o.Filter, o.Partitions)
	if err != nil {
		return nil, err
	}
	name := o.WorkStream()
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = createWorkStream(ctx, js, o, tr)
	}
	if err != nil {
		return nil, fmt.Errorf("look up work stream %s of group %s: %w", name, o.Name, err)
	}
	if err := checkWorkStream(stream.CachedInfo().Config, o.stream(), tr); err != nil {
		return nil, fmt.Errorf("group %s: work stream %s: %w", o.Name, name, err)
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
func createWorkStream(ctx context.Context, js jetstream.JetStream, o DurableOptions, tr jetstream.SubjectTransformConfig) (jetstream.Stream, error) {
	src, err := o.workStreamSource(ctx, js, tr)
	if err != nil {
		return nil, err
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: o.WorkStream(),
		Description: fmt.Sprintf("pleg-bridge group %s: events of %s in %d partitions by pod UID",
			o.Name, o.stream(), o.Partitions),
		Sources: []*jetstream.StreamSource{&src},
		// An event leaves the work stream once its partition's consumer
		// acks it, so the stream holds the group's backlog, not a copy of
		// the history.
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  o.Replicas,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, o.WorkStream())
	}
	return stream, err
}

// checkWorkStream reports ErrGroupChanged if cfg does not source exactly
// origin through tr into a work queue.
func checkWorkStream(cfg jetstream.StreamConfig, origin string, tr jetstream.SubjectTransformConfig) error {
	if cfg.Retention != jetstream.WorkQueuePolicy || len(cfg.Sources) != 1 || cfg.Sources[0] == nil {
		return fmt.Errorf("%w: it is not a work queue with one source", ErrGroupChanged)
	}
	src := cfg.Sources[0]
	if src.Name != origin || !slices.Equal(src.SubjectTransforms, []jetstream.SubjectTransformConfig{tr}) {
		return fmt.Errorf("%w: it sources %s through %+v, want %s through %+v",
			ErrGroupChanged, src.Name, src.SubjectTransforms, origin, tr)
	}
	return nil
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
