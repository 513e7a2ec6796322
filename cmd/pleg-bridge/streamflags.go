package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

const defaultNATSURL = "nats://127.0.0.1:4222"

// streamFlags are the flags tail and replay share: where the events are,
// which of them to print and how.
type streamFlags struct {
	nats      *natsFlags
	stream    string
	prefix    string
	bucket    string
	node      string
	pod       string
	namespace string
	container string
	typ       string
	selector  string
	failed    bool
	json      bool
	color     string
	archive   bool
	// archiveStream is PLEG_ARCHIVE_STREAM, the archive's name if set.
	archiveStream string

	// Set by parse.
	podUID, podNamespace, podName, lifecycleType string
	labels                                       consumer.Selector
}

// streamFlagsHelp is the part of tail's and replay's help that explains
// the filters.
const streamFlagsHelp = `Filters combine: an event must match all of them. --node, --namespace (also
the namespace of --pod namespace/name), a --pod UID and --type are subject
tokens, applied by the NATS server, which sends only matching events. A pod's
name, --container, --selector and --failed are not in the subject: they are
checked on each event the server sends, so give them with --namespace or
--node to keep that traffic small. With --archive (the archive stream the
bridges keep with PLEG_ARCHIVE_MAX_AGE), the pod UID is not in the subject
either: --pod is checked on each event too.`

// addStreamFlags defines the shared flags on c, with defaults from the
// PLEG_ environment the agent itself reads.
func addStreamFlags(c *cobra.Command, getenv func(string) string) *streamFlags {
	f := &streamFlags{}
	fs := c.Flags()
	f.nats = addNATSFlags(fs, getenv)
	fs.StringVar(&f.stream, "stream", cmp.Or(getenv("PLEG_STREAM"), schemas.DefaultStream), "JetStream stream name (env PLEG_STREAM)")
	fs.StringVar(&f.prefix, "prefix", cmp.Or(getenv("PLEG_SUBJECT_PREFIX"), schemas.DefaultSubjectPrefix), "subject prefix (env PLEG_SUBJECT_PREFIX)")
	fs.StringVar(&f.bucket, "bucket", cmp.Or(getenv("PLEG_STATE_BUCKET"), schemas.DefaultStateBucket), "the bridges' state bucket, which completes --node, --namespace and --pod (env PLEG_STATE_BUCKET)")
	fs.StringVar(&f.node, "node", "", "only events of this node (node name)")
	fs.StringVar(&f.pod, "pod", "", "only events of this pod: its UID, or namespace/name (the name is checked on each event)")
	fs.StringVarP(&f.namespace, "namespace", "n", "", "only events of pods in this namespace")
	fs.StringVarP(&f.container, "container", "c", "", "only events of containers with this name (checked on each event; never a sandbox)")
	fs.StringVar(&f.typ, "type", "", "only events of this type: started, died or removed (any case; ContainerDied works too)")
	fs.StringVarP(&f.selector, "selector", "l", "", "only events of pods whose labels match this Kubernetes label selector: app=web, tier!=db, 'env in (prod,stage)', !canary (checked on each event)")
	fs.BoolVar(&f.failed, "failed", false, "only failures: deaths with a non-zero exit code or a reason such as OOMKilled (checked on each event)")
	f.archiveStream = getenv("PLEG_ARCHIVE_STREAM")
	fs.BoolVar(&f.archive, "archive", false, "read the archive stream instead (env PLEG_ARCHIVE_STREAM, else <stream>_ARCHIVE): kept longer than the stream, on subjects without the pod UID, so --pod is checked on each event")
	fs.BoolVar(&f.json, "json", false, "print each event as its CloudEvent JSON on one line")
	fs.StringVar(&f.color, "color", "auto", "highlight containers that died with a non-zero exit or OOMKilled: auto (on a terminal, unless NO_COLOR is set), always or never")
	_ = c.RegisterFlagCompletionFunc("type", cobra.FixedCompletions([]string{"started", "died", "removed"}, cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("color", cobra.FixedCompletions([]string{"auto", "always", "never"}, cobra.ShellCompDirectiveNoFileComp))
	registerStateCompletions(c, stateFlags{nats: f.nats, bucket: &f.bucket, node: &f.node, namespace: &f.namespace, pod: &f.pod})
	return f
}

// parse validates the shared flags of the command cmd and returns the
// consumer options they select on the server and the filter to check on
// each event. Its errors are *cli.UsageError.
func (f *streamFlags) parse(cmd string) (consumer.Options, eventFilter, error) {
	if err := schemas.ValidatePrefix(f.prefix); err != nil {
		return consumer.Options{}, eventFilter{}, cli.UsageErrorf(cmd, "--prefix %q: %w", f.prefix, err)
	}
	if f.stream == "" {
		return consumer.Options{}, eventFilter{}, cli.UsageErrorf(cmd, "--stream is empty")
	}
	if f.archive {
		f.stream = cmp.Or(f.archiveStream, schemas.ArchiveName(f.stream))
	}
	f.nats.stream = f.stream
	var err error
	if f.podUID, f.podNamespace, f.podName, err = parsePod(f.pod); err != nil {
		return consumer.Options{}, eventFilter{}, &cli.UsageError{Cmd: cmd, Err: err}
	}
	if f.podNamespace != "" && f.namespace != "" && f.podNamespace != f.namespace {
		return consumer.Options{}, eventFilter{}, cli.UsageErrorf(cmd, "--pod %s is not in --namespace %s", f.pod, f.namespace)
	}
	if ns := cmp.Or(f.podNamespace, f.namespace); ns != "" {
		if err := consumer.ValidateNamespace(ns); err != nil {
			flag := "--namespace"
			if f.podNamespace != "" {
				flag = "--pod"
			}
			return consumer.Options{}, eventFilter{}, cli.UsageErrorf(cmd, "%s: %w", flag, err)
		}
	}
	if f.labels, err = consumer.ParseSelector(f.selector); err != nil {
		return consumer.Options{}, eventFilter{}, cli.UsageErrorf(cmd, "--selector: %w", err)
	}
	if f.typ != "" {
		if f.lifecycleType, err = parseType(f.typ); err != nil {
			return consumer.Options{}, eventFilter{}, &cli.UsageError{Cmd: cmd, Err: err}
		}
	}
	opts := consumer.Options{
		Stream:        f.stream,
		Archive:       f.archive,
		SubjectPrefix: f.prefix,
		Filter: consumer.Filter{
			Node:      f.node,
			Namespace: cmp.Or(f.podNamespace, f.namespace),
			PodUID:    f.podUID,
			PodName:   f.podName,
			Type:      f.lifecycleType,
			Selector:  f.labels,
			Failed:    f.failed,
		},
	}
	match := eventFilter{namespace: cmp.Or(f.podNamespace, f.namespace), pod: f.podName, container: f.container}
	return opts, match, nil
}

// describe names what the filter flags select, for messages on stderr:
// "pod default/web-0, type ContainerDied", or "" for everything. It needs
// parse first.
func (f *streamFlags) describe() string {
	parts := f.places()
	if f.container != "" {
		parts = append(parts, "container "+f.container)
	}
	if f.lifecycleType != "" {
		parts = append(parts, "type "+f.lifecycleType)
	}
	if !f.labels.Empty() {
		parts = append(parts, "labels "+f.labels.String())
	}
	if f.failed {
		parts = append(parts, "failures only")
	}
	return strings.Join(parts, ", ")
}

// places names the node, pod and namespace the flags select: what the
// state bucket knows. It needs parse first.
func (f *streamFlags) places() []string {
	var parts []string
	if f.node != "" {
		parts = append(parts, "node "+f.node)
	}
	switch {
	case f.podName != "":
		parts = append(parts, "pod "+f.podNamespace+"/"+f.podName)
	case f.podUID != "":
		parts = append(parts, "pod UID "+f.podUID)
	}
	if f.namespace != "" && f.podName == "" {
		parts = append(parts, "namespace "+f.namespace)
	}
	return parts
}

// podUIDHint is "" or, when --pod was taken as a UID but has not the shape
// of one, what to write for a pod by name. It needs parse first.
func (f *streamFlags) podUIDHint() string {
	if f.podUID == "" || isUID(f.podUID) {
		return ""
	}
	return fmt.Sprintf("--pod %s is taken as a pod UID, a pod by name is --pod <namespace>/%s", f.podUID, f.podUID)
}

// lastSeq returns the last sequence of the flags' stream. A stream that
// does not exist is an error naming --stream and the server.
func (f *streamFlags) lastSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(ctx, f.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if f.archive {
			return 0, fmt.Errorf("archive stream %s not found on %s (--archive; the bridges keep it with PLEG_ARCHIVE_MAX_AGE, named PLEG_ARCHIVE_STREAM)", f.stream, bridge.RedactURLs(f.nats.url))
		}
		return 0, fmt.Errorf("stream %s not found on %s (--stream; the bridges publish to PLEG_STREAM)", f.stream, bridge.RedactURLs(f.nats.url))
	}
	if err != nil {
		return 0, fmt.Errorf("look up stream %s: %w", f.stream, err)
	}
	return s.CachedInfo().State.LastSeq, nil
}

// where names the stream and the server, without a password.
func (f *streamFlags) where() string {
	if f.nats.contextUsed != "" {
		return fmt.Sprintf("stream %s on %s (nats context %s)", f.stream, bridge.RedactURLs(f.nats.url), f.nats.contextUsed)
	}
	return fmt.Sprintf("stream %s on %s", f.stream, bridge.RedactURLs(f.nats.url))
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

// formatTime writes a time given by a flag for messages on stderr.
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
