package publish_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// BenchmarkPublish measures events per second through Send to the JetStream
// ack against an in-process server, and the Send-to-ack latency (p50, p99)
// that OnAck observes: memory only, and with every event written through
// to a spool (the bridge's default with a data directory), in the same run.
func BenchmarkPublish(b *testing.B) {
	b.Run("memory", func(b *testing.B) { benchmarkPublish(b, false) })
	b.Run("write-through", func(b *testing.B) { benchmarkPublish(b, true) })
}

func benchmarkPublish(b *testing.B, writeThrough bool) {
	const pods = 100
	_, url := publishtest.NewServer(b)
	_, js := publishtest.Connect(b, url)
	ensureStream(b, js)

	// OnAck runs on Run's goroutine only; latencies is read after Run
	// returned.
	latencies := make([]time.Duration, 0, b.N)
	done := make(chan struct{})
	// room is signalled by each ack: Send does not wait for room, so the
	// loop below does when the outbox is full.
	room := make(chan struct{}, 1)
	opts := publish.Options{WriteThrough: writeThrough}
	if writeThrough {
		st, err := datadir.Open(b.TempDir(), datadir.Options{Node: "node-1", SpoolMaxBytes: 256 << 20})
		if err != nil {
			b.Fatal(err)
		}
		stCtx, stStop := context.WithCancel(context.Background())
		stErr := make(chan error, 1)
		go func() { stErr <- st.Run(stCtx) }()
		b.Cleanup(func() {
			stStop()
			<-stErr
			st.Close()
		})
		opts.Spool = st.Spool()
	}
	opts.Encoder = newEncoder(b, publish.EncoderOptions{})
	opts.Logger = slog.New(slog.DiscardHandler)
	pub, err := publish.New(js.Conn(), publish.Options{
		Spool:        opts.Spool,
		WriteThrough: opts.WriteThrough,
		Encoder:      opts.Encoder,
		Logger:       opts.Logger,
		OnAck: func(ev generator.Event, _ uint64) {
			latencies = append(latencies, time.Since(ev.ObservedAt))
			if len(latencies) == b.N {
				close(done)
			}
			select {
			case room <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- pub.Run(ctx) }()

	// The events are built before the timer starts; each has its own id so
	// none is a duplicate.
	events := make([]generator.Event, b.N)
	for i := range events {
		events[i] = testEvent(fmt.Sprintf("pod-%03d", i%pods), i)
	}
	b.ResetTimer()
	start := time.Now()
	for i := range events {
		events[i].ObservedAt = time.Now()
		for {
			err := pub.Send(ctx, events[i:i+1])
			var full *generator.SinkFullError
			if errors.As(err, &full) {
				<-room
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			break
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatalf("%d of %d events acked within a minute", pub.Pending(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-runErr; err != nil {
		b.Fatalf("Run() = %v", err)
	}

	slices.Sort(latencies)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ack-ms")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ack-ms")
}
