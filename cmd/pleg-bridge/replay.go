package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// runReplay is the replay subcommand: it prints the stored events that match
// the flags, one per line with the date, in stream order, and returns nil
// when it has printed what the stream held when it started, or when ctx is
// canceled. It needs at least one of --pod, --node and --since, so that a
// mistyped command does not dump the whole stream.
func runReplay(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sf := addStreamFlags(fs, getenv)
	now := time.Now()
	var since, until time.Time
	fs.Func("since", "start at this time: a duration before now (10m) or an RFC 3339 time", timeFlag(&since, now))
	fs.Func("until", "stop at this time: a duration before now (5m) or an RFC 3339 time", timeFlag(&until, now))
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	opts, err := sf.options()
	if err != nil {
		return err
	}
	if sf.pod == "" && sf.node == "" && since.IsZero() {
		return errors.New("replay needs at least one of --pod, --node or --since, so as not to print the whole stream")
	}
	if !until.IsZero() && until.Before(since) {
		return fmt.Errorf("--until %s is before --since %s", until.Format(time.RFC3339), since.Format(time.RFC3339))
	}
	opts.StartTime = since
	opts.EndTime = until
	opts.OnError = func(err error) { fmt.Fprintf(stderr, "skip message: %v\n", err) }

	nc, js, err := sf.connect("pleg-bridge replay")
	if err != nil {
		return err
	}
	defer nc.Close()
	err = consumer.Replay(ctx, js, opts, sf.printer(stdout, "2006-01-02 "))
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
