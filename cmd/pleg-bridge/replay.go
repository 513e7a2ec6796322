package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

// replayOptions are replay's own flags, beside the shared streamFlags.
type replayOptions struct {
	since, until time.Time
}

func newReplayCommand(env commandEnv) *cobra.Command {
	var (
		sf *streamFlags
		o  replayOptions
	)
	c := &cobra.Command{
		Use:   "replay",
		Short: "Print the stored events of a pod, a node, a namespace or a time range, and exit",
		Long: `Events are printed one line each with the date, in stream order; replay exits
once it has printed what the stream held when it started. It needs at least
one of --pod, --node, --namespace, --container or --since, so that a
mistyped command does not print the whole stream. If no event matched, it
says so on stderr.

` + streamFlagsHelp,
		Example: `  pleg-bridge replay --pod default/web-0                 # a pod's history, by namespace/name
  pleg-bridge replay --pod 6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70
  pleg-bridge replay --node node-1 --since 1h --until 10m
  pleg-bridge replay -n shop --type died --since 24h     # today's deaths in a namespace
  pleg-bridge replay --pod default/web-0 --json | jq .data.exitCode`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runReplay(c.Context(), c.CommandPath(), sf, o, env)
		},
	}
	sf = addStreamFlags(c, env.getenv)
	now := time.Now()
	f := c.Flags()
	f.Func("since", "start at `TIME`: a duration before now (10m) or an RFC 3339 time", timeFlag(&o.since, now))
	f.Func("until", "stop at `TIME`: a duration before now (5m) or an RFC 3339 time", timeFlag(&o.until, now))
	return c
}

// runReplay prints the stored events that sf selects, one per line with
// the date, in stream order, and returns nil when it has printed what the
// stream held when it started, when ctx is canceled, or when the reader of
// stdout goes away. If no event matched, it says so on stderr.
func runReplay(ctx context.Context, cmd string, sf *streamFlags, o replayOptions, env commandEnv) error {
	opts, match, err := sf.parse(cmd)
	if err != nil {
		return err
	}
	if sf.pod == "" && sf.node == "" && sf.namespace == "" && sf.container == "" && o.since.IsZero() {
		return cli.UsageErrorf(cmd, "replay needs at least one of --pod, --node, --namespace, --container or --since, so as not to print the whole stream")
	}
	if !o.until.IsZero() && o.until.Before(o.since) {
		return cli.UsageErrorf(cmd, "--until %s is before --since %s", formatTime(o.until), formatTime(o.since))
	}
	color, err := useColor(sf.color, env.stdout, env.getenv)
	if err != nil {
		return &cli.UsageError{Cmd: cmd, Err: err}
	}
	opts.StartTime, opts.EndTime = o.since, o.until
	opts.OnError = func(err error) { fmt.Fprintf(env.stderr, "skip message: %v\n", err) }

	ctx, nc, js, err := sf.nats.connect(ctx, "pleg-bridge replay")
	if err != nil {
		return err
	}
	defer nc.Close()
	if len(sf.nats.namespaces) > 0 {
		// A reader limited to namespaces may not read the legacy layout:
		// do not ask.
		opts.Legacy = consumer.LegacyNever
	}
	if _, err := sf.lastSeq(ctx, js); err != nil {
		if ctx.Err() != nil {
			return refusal(ctx)
		}
		return err
	}
	p := printer{w: env.stdout, json: sf.json, date: true, color: color}
	opts.Repeats.OnRepeat = func(r consumer.Repeat) { reportRepeat(env.stderr, cmd, match, r) }
	matched := 0
	err = consumer.Replay(ctx, js, opts, func(e consumer.Event) error {
		if !match.match(e) {
			return nil
		}
		matched++
		return p.print(e)
	})
	if err := refusal(ctx); err != nil {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	if err != nil {
		return endOfOutput(err)
	}
	if matched == 0 {
		fmt.Fprintf(env.stderr, "%s: no events matched %s\n", cmd, nothingMatched(sf, o))
	}
	return nil
}

// nothingMatched says what replay looked for, with a hint when a --pod
// that is not UID-shaped was taken as a UID.
func nothingMatched(sf *streamFlags, o replayOptions) string {
	s := sf.describe()
	if s == "" {
		s = "any filter"
	}
	if !o.since.IsZero() {
		s += ", since " + formatTime(o.since)
	}
	if !o.until.IsZero() {
		s += ", until " + formatTime(o.until)
	}
	s += " in " + sf.where()
	if h := sf.podUIDHint(); h != "" {
		s += "; " + h
	}
	return s
}
