package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

const defaultNATSURL = "nats://127.0.0.1:4222"

// streamFlags are the flags tail and replay share: where the events are and
// which of them to print.
type streamFlags struct {
	natsURL string
	stream  string
	prefix  string
	node    string
	pod     string
	typ     string
	json    bool
}

// addStreamFlags defines the shared flags on fs, with defaults from the
// PLEG_ environment the agent itself reads.
func addStreamFlags(fs *flag.FlagSet, getenv func(string) string) *streamFlags {
	f := &streamFlags{}
	fs.StringVar(&f.natsURL, "nats-url", cmp.Or(getenv("PLEG_NATS_URL"), defaultNATSURL), "NATS server URL (env PLEG_NATS_URL)")
	fs.StringVar(&f.stream, "stream", cmp.Or(getenv("PLEG_STREAM"), schemas.DefaultStream), "JetStream stream name (env PLEG_STREAM)")
	fs.StringVar(&f.prefix, "prefix", cmp.Or(getenv("PLEG_SUBJECT_PREFIX"), schemas.DefaultSubjectPrefix), "subject prefix (env PLEG_SUBJECT_PREFIX)")
	fs.StringVar(&f.node, "node", "", "only events of this node (node name)")
	fs.StringVar(&f.pod, "pod", "", "only events of this pod (pod UID)")
	fs.StringVar(&f.typ, "type", "", "only events of this type: ContainerStarted, ContainerDied or ContainerRemoved")
	fs.BoolVar(&f.json, "json", false, "print each event as its CloudEvent JSON on one line")
	return f
}

// options validates the shared flags and returns the consumer options they
// select.
func (f *streamFlags) options() (consumer.Options, error) {
	if err := schemas.ValidatePrefix(f.prefix); err != nil {
		return consumer.Options{}, fmt.Errorf("--prefix %q: %w", f.prefix, err)
	}
	if f.stream == "" {
		return consumer.Options{}, errors.New("--stream is empty")
	}
	filter := consumer.Filter{Node: f.node, PodUID: f.pod, Type: f.typ}
	if _, err := (consumer.Filter{Type: f.typ}).Subject(f.prefix); err != nil {
		return consumer.Options{}, fmt.Errorf("--type: %w", err)
	}
	return consumer.Options{Stream: f.stream, SubjectPrefix: f.prefix, Filter: filter}, nil
}

// connect connects to the flags' NATS URL under the client name name.
func (f *streamFlags) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(f.natsURL, nats.Name(name))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s (--nats-url): %w", redactURLs(f.natsURL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("create JetStream handle: %w", err)
	}
	return nc, js, nil
}

// printer returns the function that writes one event per line to w: the
// CloudEvent JSON with --json, else timePrefix of the event's time (may be
// empty) and consumer.Format.
func (f *streamFlags) printer(w io.Writer, timePrefix string) func(consumer.Event) error {
	return func(e consumer.Event) error {
		var line []byte
		if f.json {
			b, err := e.CloudEventJSON()
			if err != nil {
				return err
			}
			line = append(b, '\n')
		} else {
			var s string
			if timePrefix != "" {
				s = e.Time.Format(timePrefix)
			}
			line = []byte(s + consumer.Format(e) + "\n")
		}
		if _, err := w.Write(line); err != nil {
			return fmt.Errorf("write event: %w", err)
		}
		return nil
	}
}

// redactURLs hides the passwords of a comma-separated list of server URLs.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// timeFlag parses a flag value that is either a duration before now ("10m")
// or an RFC 3339 time, into *t.
func timeFlag(t *time.Time, now time.Time) func(string) error {
	return func(s string) error {
		if d, err := time.ParseDuration(s); err == nil {
			if d < 0 {
				return fmt.Errorf("duration %s is negative", s)
			}
			*t = now.Add(-d)
			return nil
		}
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return errors.New("want a duration before now (10m, 2h) or an RFC 3339 time (2026-01-02T03:04:05Z)")
		}
		*t = v
		return nil
	}
}

// parseFlags parses args into fs and refuses positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// runTail is the tail subcommand: it prints the live events that match the
// flags, one per line, until ctx is done, then returns nil. A message that
// is not a pleg-bridge event is reported on stderr and skipped. Times are
// printed as the events carry them (UTC).
func runTail(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sf := addStreamFlags(fs, getenv)
	all := fs.Bool("all", false, "start at the beginning of the stream")
	var since time.Time
	fs.Func("since", "start at this time: a duration before now (10m) or an RFC 3339 time", timeFlag(&since, time.Now()))
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	opts, err := sf.options()
	if err != nil {
		return err
	}
	if *all && !since.IsZero() {
		return errors.New("--all and --since cannot be combined")
	}
	opts.DeliverAll = *all
	opts.StartTime = since
	opts.OnError = func(err error) { fmt.Fprintf(stderr, "skip message: %v\n", err) }

	nc, js, err := sf.connect("pleg-bridge tail")
	if err != nil {
		return err
	}
	defer nc.Close()
	return consumer.Subscribe(ctx, js, opts, sf.printer(stdout, ""))
}
