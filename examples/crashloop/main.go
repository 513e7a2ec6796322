// Command crashloop is an example downstream service of pleg-bridge: a
// crash-loop detector. It follows the ContainerDied events through a durable
// consumer group (consumer.Consume), counts each pod's non-zero exits over a
// sliding window and prints a line for every crash that puts a pod at or
// over a threshold.
//
// Run as many replicas as you like with the same -group: they split the
// pods between them, and a replica that is killed and restarted carries on
// where the group stopped, counting nothing twice.
//
//	crashloop -nats-url nats://127.0.0.1:4222 -window 10m -threshold 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashloop:", err)
		os.Exit(1)
	}
}

// run parses args, connects to NATS and runs the detector until ctx is
// done (it returns nil) or consumption fails. Reports go to stdout, one
// line each; logs to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("crashloop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: crashloop [flags]

crashloop is an example downstream service of pleg-bridge: a crash-loop
detector. It follows the ContainerDied events of a pleg-bridge stream
through a durable consumer group (consumer.Consume), counts each pod's
non-zero exits over a sliding window, and prints a line for every crash
that puts a pod at or over the threshold:

  2026-01-02T03:04:05Z CRASHLOOP shop/checkout-9ccmp (uid ...) container app: 3 crashes in 10m0s, last exit 1 Error (seq 42)

Replicas run with the same -group split the pods between them; a replica
killed and restarted carries on where the group stopped, counting nothing
twice. A new group starts with the next event (-from-start: the oldest
stored). Against "go run ./cmd/pleg-bridge demo", whose crash-looping pods
restart every few seconds, the defaults report within about 30 seconds.

Flags:
`)
		fs.PrintDefaults()
	}
	var (
		url        = fs.String("nats-url", nats.DefaultURL, "NATS server `URL`")
		group      = fs.String("group", "crashloop", "durable group `name`, the same for every replica")
		stream     = fs.String("stream", "", "pleg-bridge stream `name` (default PLEG)")
		prefix     = fs.String("subject-prefix", "", "pleg-bridge subject `prefix` (default pleg)")
		node       = fs.String("node", "", "only this `node`'s pods")
		bucket     = fs.String("bucket", "crashloop", "KV `bucket` for the per-pod counts")
		window     = fs.Duration("window", 10*time.Minute, "sliding `window` over which crashes are counted")
		threshold  = fs.Int("threshold", 3, "crashes within the window that make a crash `loop`")
		partitions = fs.Int("partitions", consumer.DefaultPartitions, "partitions of a new group: at most this many pods are handled at once")
		deadLetter = fs.String("dead-letter-subject", "", "JetStream `subject` for events the detector gives up on (default: log them)")
		fromStart  = fs.Bool("from-start", false, "a new group starts with the oldest stored event instead of the next one")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "crashloop")

	nc, err := nats.Connect(*url, nats.Name("crashloop "+*group), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to nats at %s: %w", *url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("create jetstream handle: %w", err)
	}

	var mu sync.Mutex // serialises report lines
	det, err := NewDetector(ctx, js, DetectorOptions{
		Bucket: *bucket, Window: *window, Threshold: *threshold,
		OnReport: func(r Report) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintln(stdout, formatReport(r))
		},
	})
	if err != nil {
		return err
	}
	logger.Info("following crashes", "group", *group, "nats_url", *url, "window", *window, "threshold", *threshold)
	return consumer.Consume(ctx, js, consumer.DurableOptions{
		Name:              *group,
		Stream:            *stream,
		SubjectPrefix:     *prefix,
		Filter:            consumer.Filter{Node: *node, Type: "ContainerDied"},
		DeliverAll:        *fromStart,
		Partitions:        *partitions,
		DeadLetterSubject: *deadLetter,
		OnDeadLetter: func(d consumer.DeadLetter) {
			logger.Warn("gave up on an event", "seq", d.Event.Sequence, "pod_uid", d.Event.PodUID,
				"deliveries", d.Deliveries, "err", d.Err)
		},
	}, det.Handle)
}

// formatReport is the line printed for a report.
func formatReport(r Report) string {
	crashes := "crashes"
	if r.Crashes == 1 {
		crashes = "crash"
	}
	return fmt.Sprintf("%s CRASHLOOP %s/%s (uid %s) container %s: %d %s in %s, last exit %d %s (seq %d)",
		r.Time.Format(time.RFC3339), r.Namespace, r.Pod, r.PodUID, r.Container, r.Crashes, crashes, r.Window, r.ExitCode, r.Reason, r.Sequence)
}
