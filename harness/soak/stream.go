package soak

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// settlePoll is how often the stream's message count is read while the
// bridge catches up after the churn stopped.
const settlePoll = 200 * time.Millisecond

// readBatch is the number of messages fetched at once when reading the
// stream back, and readWait how long one fetch may wait for them.
const (
	readBatch = 1000
	readWait  = 5 * time.Second
	// readRetries bounds the fresh starts of a read that a transient
	// error (no responders, missed heartbeats) cut short.
	readRetries = 10
)

// connectNATS connects the soak's own client, which reconnects forever:
// NATS goes away during faults.
func connectNATS(urls []string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(strings.Join(urls, ","),
		nats.Name("pleg-bridge soak"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("create JetStream context: %w", err)
	}
	return nc, js, nil
}

// settle waits until stream holds at least want messages, or timeout
// passed, and returns how many it holds. Errors while NATS recovers are
// retried until the timeout; the last one is returned with the count 0
// if the stream was never read.
func settle(ctx context.Context, js jetstream.JetStream, stream string, want int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(settlePoll)
	defer ticker.Stop()
	held, lastErr := 0, error(nil)
	for {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := js.Stream(ictx, stream)
		cancel()
		if err == nil {
			held, lastErr = int(s.CachedInfo().State.Msgs), nil
			if held >= want {
				return held, nil
			}
		} else {
			lastErr = err
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				return held, fmt.Errorf("read stream %s: %w", stream, lastErr)
			}
			return held, nil
		}
		select {
		case <-ctx.Done():
			return held, ctx.Err()
		case <-ticker.C:
		}
	}
}

// readStream reads every message of stream with an ordered consumer, as a
// subscriber replaying history would, and decodes it as the consumer
// package does. Messages that do not decode are returned as descriptions.
func readStream(ctx context.Context, js jetstream.JetStream, stream string) ([]Stored, []string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, nil, fmt.Errorf("look up stream %s: %w", stream, err)
	}
	last := s.CachedInfo().State.LastSeq
	if last == 0 {
		return nil, nil, nil
	}
	var (
		stored      []Stored
		undecodable []string
		seq         uint64
		cons        jetstream.Consumer
		retries     int
	)
	// A cluster that has just been through failovers, on a busy machine, can
	// leave a request without a responder for a moment; the read resumes
	// after the last message it got, with a new consumer.
	transient := func(err error) bool {
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoHeartbeat) || retries == readRetries {
			return false
		}
		retries++
		cons = nil
		return true
	}
	for seq < last {
		if cons == nil {
			var err error
			cons, err = s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq + 1})
			if err != nil {
				if transient(err) {
					continue
				}
				return nil, nil, fmt.Errorf("create consumer on stream %s after sequence %d: %w", stream, seq, err)
			}
		}
		batch, err := cons.Fetch(readBatch, jetstream.FetchMaxWait(readWait))
		if err != nil {
			if transient(err) {
				continue
			}
			return nil, nil, fmt.Errorf("read stream %s after sequence %d: %w", stream, seq, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil {
				return nil, nil, fmt.Errorf("read stream %s: message metadata: %w", stream, err)
			}
			seq = meta.Sequence.Stream
			e, err := consumer.DecodeMsg(msg)
			if err != nil {
				undecodable = append(undecodable, fmt.Sprintf("sequence %d: %v", seq, err))
				continue
			}
			stored = append(stored, Stored{
				Seq: seq, ID: e.ID, ContainerID: e.ContainerID, PodUID: e.PodUID,
				Type: e.LifecycleType(), StoredAt: meta.Timestamp,
			})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			if transient(err) {
				continue
			}
			return nil, nil, fmt.Errorf("read stream %s after sequence %d: %w", stream, seq, err)
		}
		if n == 0 && seq < last {
			return nil, nil, fmt.Errorf("read stream %s: nothing after sequence %d within %v, though it held %d", stream, seq, readWait, last)
		}
	}
	return stored, undecodable, nil
}
