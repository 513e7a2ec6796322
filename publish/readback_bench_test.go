package publish_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// BenchmarkReadBack measures what a restart costs the bridge and the
// server to read back what its node stored after the checkpoint, for a
// crash's typical few hundred messages and for far more (a node whose
// checkpoint lagged a whole outage's drain): "decoded" is the read as it
// is, each message fetched whole and decoded into the event the generator
// and the checkpoint take in; "ids" is the same consumer fetching headers
// only, the read before it decoded (the baseline, in the same run). One op
// is one whole read: the Publisher built and run until OnStored has every
// event.
func BenchmarkReadBack(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		_, url := publishtest.NewServer(b)
		_, js := publishtest.Connect(b, url)
		ensureStream(b, js)
		enc := newEncoder(b, publish.EncoderOptions{})
		for i := range n {
			ev := testEvent(fmt.Sprintf("pod-%d", i%110), i)
			ev.Pod.Meta = generator.NewPodMeta(map[string]string{"app": "web", "team": "shop", "tier": "frontend"}, nil)
			if _, err := js.PublishMsgAsync(encode(b, enc, ev)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("the stored messages were not acked")
		}
		b.Run(fmt.Sprintf("decoded/%d", n), func(b *testing.B) {
			for b.Loop() {
				stored := make(chan []generator.Event, 1)
				pub, err := publish.New(js.Conn(), publish.Options{
					Encoder: enc, Stream: "PLEG", Logger: slog.New(slog.DiscardHandler),
					Restart: publish.Restart{From: 1, OnStored: func(evs []generator.Event) { stored <- evs }},
				})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(b.Context())
				done := make(chan error, 1)
				go func() { done <- pub.Run(ctx) }()
				if evs := <-stored; len(evs) != n {
					b.Fatalf("read back %d events, want %d", len(evs), n)
				}
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n), "µs/msg")
		})
		b.Run(fmt.Sprintf("ids/%d", n), func(b *testing.B) {
			for b.Loop() {
				s, err := js.Stream(b.Context(), "PLEG")
				if err != nil {
					b.Fatal(err)
				}
				cons, err := s.CreateConsumer(b.Context(), jetstream.ConsumerConfig{
					DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 1,
					FilterSubject: "pleg.node-1.>", AckPolicy: jetstream.AckNonePolicy,
					HeadersOnly: true, MemoryStorage: true, Replicas: 1,
				})
				if err != nil {
					b.Fatal(err)
				}
				ids := map[string]uint64{}
				for len(ids) < n {
					batch, err := cons.FetchNoWait(min(n-len(ids), 1024))
					if err != nil {
						b.Fatal(err)
					}
					for m := range batch.Messages() {
						md, err := m.Metadata()
						if err != nil {
							b.Fatal(err)
						}
						ids[m.Headers().Get(jetstream.MsgIDHeader)] = md.Sequence.Stream
					}
					if err := batch.Error(); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.DeleteConsumer(b.Context(), cons.CachedInfo().Name); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n), "µs/msg")
		})
	}
}
