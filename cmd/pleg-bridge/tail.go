package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

// tailOptions are tail's own flags, beside the shared streamFlags.
type tailOptions struct {
	all     bool
	since   time.Time
	fromSeq uint64
}

func newTailCommand(env commandEnv) *cobra.Command {
	var (
		sf *streamFlags
		o  tailOptions
	)
	c := &cobra.Command{
		Use:   "tail",
		Short: "Follow container lifecycle events as they arrive, one line each, until Ctrl-C",
		Long: `Lines read from the stream's history (--all, --since, --from-seq) carry the
date. On a terminal, a container that died with a non-zero exit code or was
OOMKilled is shown in red. What tail follows, and where it stopped, is said
on stderr; so is a --pod, --node or --namespace of which the state bucket
(--bucket) knows no container now, and tail follows it anyway.

` + streamFlagsHelp,
		Example: `  pleg-bridge tail                                      # every event from now on
  pleg-bridge tail --pod default/web-0                  # one pod, by namespace/name
  pleg-bridge tail --pod 6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70
  pleg-bridge tail -n kube-system --type died           # deaths in a namespace
  pleg-bridge tail --node node-1 --container app
  pleg-bridge tail --since 10m                          # the last 10 minutes, then follow
  pleg-bridge tail --from-seq 1042                      # resume where an earlier tail stopped
  pleg-bridge tail --all --json | jq .data.exitCode     # everything stored, as CloudEvent JSON`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runTail(c.Context(), c.CommandPath(), sf, o, env)
		},
	}
	sf = addStreamFlags(c, env.getenv)
	f := c.Flags()
	f.BoolVar(&o.all, "all", false, "start at the beginning of the stream, then follow")
	f.Func("since", "start at `TIME`, then follow: a duration before now (10m) or an RFC 3339 time", timeFlag(&o.since, time.Now()))
	f.Uint64Var(&o.fromSeq, "from-seq", 0, "start at this stream sequence, then follow")
	return c
}

// runTail prints the events that sf selects, one per line, from where o
// says, until ctx is done, then returns nil. Starting in the past, it says
// on stderr when none of the stored events matched. It also returns nil, having
// deleted its consumer, when the reader of stdout goes away. A message that
// is not a pleg-bridge event is reported on stderr and skipped.
func runTail(ctx context.Context, cmd string, sf *streamFlags, o tailOptions, env commandEnv) error {
	opts, match, err := sf.parse(cmd)
	if err != nil {
		return err
	}
	var starts []string
	if o.all {
		starts = append(starts, "--all")
	}
	if !o.since.IsZero() {
		starts = append(starts, "--since")
	}
	if o.fromSeq != 0 {
		starts = append(starts, "--from-seq")
	}
	if len(starts) > 1 {
		return cli.UsageErrorf(cmd, "%s cannot be combined", strings.Join(starts, " and "))
	}
	color, err := useColor(sf.color, env.stdout, env.getenv)
	if err != nil {
		return &cli.UsageError{Cmd: cmd, Err: err}
	}
	opts.DeliverAll, opts.StartTime, opts.StartSeq = o.all, o.since, o.fromSeq
	opts.OnError = func(err error) { fmt.Fprintf(env.stderr, "skip message: %v\n", err) }

	ctx, nc, js, err := sf.nats.connect(ctx, "pleg-bridge tail")
	if err != nil {
		return err
	}
	defer nc.Close()
	if len(sf.nats.namespaces) > 0 {
		// A reader limited to namespaces may not read the legacy layout:
		// do not ask.
		opts.Legacy = consumer.LegacyNever
	}
	// The stream is looked up first, so that a mistyped --stream fails
	// before tail says it follows.
	stored, err := sf.lastSeq(ctx, js)
	if err != nil {
		if ctx.Err() != nil {
			return refusal(ctx)
		}
		return err
	}
	if len(starts) == 0 {
		// From now: from the first event after those stored when tail
		// says it follows, however long the hint below takes.
		opts.StartSeq = stored + 1
	}

	what := "every event"
	if d := sf.describe(); d != "" {
		what = "events of " + d
	}
	from := "from now"
	switch {
	case o.all:
		from = "from the beginning of the stream"
	case !o.since.IsZero():
		from = "from " + formatTime(o.since)
	case o.fromSeq != 0:
		from = fmt.Sprintf("from stream sequence %d", o.fromSeq)
	}
	fmt.Fprintf(env.stderr, "%s: following %s in %s, %s (Ctrl-C stops)\n", cmd, what, sf.where(), from)
	if hint := unknownHint(ctx, sf); hint != "" {
		fmt.Fprintf(env.stderr, "%s: %s\n", cmd, hint)
	}

	history := len(starts) > 0
	p := printer{w: env.stdout, json: sf.json, date: history, color: color}
	var (
		last    uint64 // the stream sequence of the last event read, matched or not
		matched int
	)
	if history {
		opts.OnCaughtUp = func() {
			if matched == 0 {
				fmt.Fprintf(env.stderr, "%s: no stored events matched; waiting for new ones\n", cmd)
			}
		}
	}
	opts.Repeats.OnRepeat = func(r consumer.Repeat) {
		last = r.Event.Sequence
		reportRepeat(env.stderr, cmd, match, r)
	}
	opts.OnRollback = func(r consumer.Rollback) {
		fmt.Fprintf(env.stderr, "%s: the stream no longer holds what was read up to sequence %d (its servers lost messages they had acknowledged); reading again from %s\n", cmd, r.LastRead, rollbackFrom(r))
	}
	err = consumer.Subscribe(ctx, js, opts, func(e consumer.Event) error {
		last = e.Sequence
		if !match.match(e) {
			return nil
		}
		matched++
		return p.print(e)
	})
	if err := refusal(ctx); err != nil {
		return err
	}
	if err != nil {
		return endOfOutput(err)
	}
	if last > 0 {
		fmt.Fprintf(env.stderr, "%s: stopped after stream sequence %d; --from-seq %d continues from there\n", cmd, last, last+1)
	}
	return nil
}

// reportRepeat says on stderr that an event which match selects was not
// printed again: the stream holds it a second time, which happens when the
// NATS servers lost it after it was read and its bridge published it again.
func reportRepeat(w io.Writer, cmd string, match eventFilter, r consumer.Repeat) {
	if !match.match(r.Event) {
		return
	}
	fmt.Fprintf(w, "%s: skipped %s %s at stream sequence %d, a repeat of sequence %d (published again by its bridge after the NATS servers lost it)\n",
		cmd, r.Event.LifecycleType(), r.Event.Subject, r.Event.Sequence, r.FirstSequence)
}

// unknownHint returns a line for stderr when the state bucket knows no
// container of the node, pod or namespace that sf selects, "" otherwise,
// so that a mistyped name does not follow silently forever. A pod may yet
// come, so tail follows anyway. It says nothing when sf selects none of
// them, or when the bucket cannot be read within stateLookupTimeout: a
// bridge may keep none, and the credentials may not allow it. It reads on
// a connection of its own, so that a refusal there is not tail's. It needs
// sf.parse first.
func unknownHint(ctx context.Context, sf *streamFlags) string {
	places := sf.places()
	if len(places) == 0 {
		return ""
	}
	filter := consumer.StateFilter{Node: sf.node, Namespace: cmp.Or(sf.podNamespace, sf.namespace), Pod: sf.podName, PodUID: sf.podUID}
	cs, err := listStateAt(ctx, sf.nats, sf.bucket, filter)
	if err != nil || len(cs) > 0 {
		return ""
	}
	hint := fmt.Sprintf("no container of %s is known now (state bucket %s)", strings.Join(places, ", "), sf.bucket)
	if h := sf.podUIDHint(); h != "" {
		hint += "; " + h
	}
	return hint + "; following anyway"
}

// rollbackFrom says where Subscribe reads again from after r.
func rollbackFrom(r consumer.Rollback) string {
	if r.From != 0 {
		return fmt.Sprintf("sequence %d", r.From)
	}
	return "the first message stored after " + r.After.UTC().Format(time.RFC3339Nano)
}
