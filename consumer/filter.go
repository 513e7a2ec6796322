package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Filter selects events by node, namespace, pod and Lifecycle event type,
// on the server, and by pod name, labels (Selector) and failure, in the
// client. An
// empty field matches anything.
//
// Node, Namespace, PodUID and Type are subject tokens, so the NATS server
// sends only the matching events (Subject). PodName, Selector and Failed are
// not in the subject: they are checked on each event the server sends, after
// its filter, so give them with a Namespace (a pod's name is unique only in
// its namespace) to keep the traffic small.
type Filter struct {
	// Node is the raw node name, as in the node extension.
	Node string
	// Namespace is the pod's namespace.
	Namespace string
	// PodUID is the pod's UID.
	PodUID string
	// PodName is the pod's name, checked in the client. With Namespace it
	// selects one pod by namespace/name without looking up its UID, and
	// follows the pods of that name as they are replaced.
	PodName string
	// Type is a Lifecycle event type: "ContainerStarted", "ContainerDied"
	// or "ContainerRemoved". The short forms of `pleg-bridge tail --type`
	// ("started", "died", "removed", in any case) and the CloudEvent type
	// ("pleg.v1.ContainerDied") are accepted too: see ParseType.
	Type string
	// Selector selects pods by their labels (the event's pod.labels),
	// checked in the client: see ParseSelector.
	Selector Selector
	// Failed selects failures only (see Failed), checked in the client.
	Failed bool
}

// Subject returns the JetStream filter subject that selects the filter's
// events under prefix: "pleg.>" for everything, "pleg.node-1.>" for one
// node, "pleg.*.shop.>" for one namespace, "pleg.*.*.<uid>.*" for one pod,
// "pleg.*.*.*.ContainerDied" for one type. Node, Namespace and PodUID are
// encoded with schemas.EncodeToken, so names with dots or other odd bytes
// match exactly their own events. It returns an error if prefix is not a
// valid subject prefix, or one wrapping ErrUnknownType if Type is not a
// Lifecycle event type.
//
// The subject selects the events of the current layout and, where it ends
// in ">" right after the prefix or the node, those of the legacy layout
// too; LegacySubject gives the filter for the legacy events otherwise.
func (f Filter) Subject(prefix string) (string, error) {
	if err := schemas.ValidatePrefix(prefix); err != nil {
		return "", fmt.Errorf("subject prefix: %w", err)
	}
	typ, err := lifecycleType(f.Type)
	if err != nil {
		return "", err
	}
	return foldSubject([]string{prefix, f.token(f.Node), f.token(f.Namespace), f.token(f.PodUID), cmp.Or(typ, "*")}), nil
}

// LegacySubject returns the filter subject that selects, among the events
// of the legacy layout (<prefix>.<node>.<podUID>.<eventType>, written by
// bridges before the namespace token), those that may match the filter: the
// server checks node, pod UID and type; the namespace, which the legacy
// subject lacks, is checked in the client. It returns "" when Subject
// already selects them (a filter on nothing or on a node only).
func (f Filter) LegacySubject(prefix string) (string, error) {
	if _, err := f.Subject(prefix); err != nil {
		return "", err
	}
	if f.Namespace == "" && f.PodUID == "" && f.Type == "" {
		return "", nil // "<prefix>.>" or "<prefix>.<node>.>"
	}
	typ, _ := lifecycleType(f.Type)
	return strings.Join([]string{prefix, f.token(f.Node), f.token(f.PodUID), cmp.Or(typ, "*")}, "."), nil
}

// ArchiveSubject returns the filter subject that selects the filter's
// events in an archive stream (PLEG_ARCHIVE_MAX_AGE), whose subjects are
// <prefix>.<node>.<namespace>.%.<eventType>: as Subject, but with "*" for
// the pod UID, which the archive's subjects do not carry; Matches checks
// PodUID in the client. "pleg.*.shop.>" for one namespace,
// "pleg.*.*.*.ContainerDied" for one type, "pleg.>" for one pod. Its errors
// are Subject's.
//
// Events of the legacy layout are archived with "%" for the namespace too:
// this subject selects them unless it names a namespace; then
// ArchiveLegacySubject selects them.
func (f Filter) ArchiveSubject(prefix string) (string, error) {
	g := f
	g.PodUID = ""
	return g.Subject(prefix)
}

// ArchiveLegacySubject returns the filter subject that selects, in an
// archive stream, the events of the legacy layout that may match a filter
// on a namespace: <prefix>.<node>.%.%.<eventType>, the namespace checked
// in the client (Matches, from the event's data). It returns "" when
// ArchiveSubject already selects them (no namespace in the filter).
func (f Filter) ArchiveLegacySubject(prefix string) (string, error) {
	if _, err := f.Subject(prefix); err != nil {
		return "", err
	}
	if f.Namespace == "" {
		return "", nil
	}
	typ, _ := lifecycleType(f.Type)
	empty := schemas.EncodeToken("")
	return strings.Join([]string{prefix, f.token(f.Node), empty, empty, cmp.Or(typ, "*")}, "."), nil
}

// token is the subject token that matches name, "*" for "".
func (Filter) token(name string) string {
	if name == "" {
		return "*"
	}
	return schemas.EncodeToken(name)
}

// foldSubject joins tokens, folding trailing "*" tokens into one ">", the
// form the README documents for subscribers.
func foldSubject(tokens []string) string {
	n := len(tokens)
	for n > 1 && tokens[n-1] == "*" {
		n--
	}
	if n < len(tokens) {
		return strings.Join(tokens[:n], ".") + ".>"
	}
	return strings.Join(tokens, ".")
}

// Matches reports whether e matches every field of the filter. Subscribe,
// Replay and durable groups check it on each event the server sends, so
// the fields the subject cannot carry (PodName, and the namespace of a
// legacy event) are applied, and so is everything else: an event on a
// subject that lies about its contents is not delivered either.
func (f Filter) Matches(e Event) bool {
	ns, name := e.Data.Pod.Namespace, e.Data.Pod.Name
	if ns == "" || name == "" {
		// Data without the pod's names: the CloudEvent subject
		// "<namespace>/<pod>[/<container>]" has them.
		var rest string
		ns, rest, _ = strings.Cut(e.Subject, "/")
		name, _, _ = strings.Cut(rest, "/")
	}
	switch {
	case f.Node != "" && e.Node != f.Node,
		f.Namespace != "" && ns != f.Namespace,
		f.PodUID != "" && e.PodUID != f.PodUID,
		f.PodName != "" && name != f.PodName:
		return false
	}
	if f.Type != "" {
		if typ, err := ParseType(f.Type); err != nil || typ != e.LifecycleType() {
			return false
		}
	}
	if f.Failed && !Failed(e) {
		return false
	}
	return f.Selector.Matches(e.Data.Pod.Labels)
}

// validate checks the fields that are not subject tokens.
func (f Filter) validate() error {
	if f.Namespace != "" {
		if err := ValidateNamespace(f.Namespace); err != nil {
			return fmt.Errorf("filter: %w", err)
		}
	}
	return nil
}

// ErrUnknownType is wrapped by the errors of ParseType, and of
// Filter.Subject for a Type that is not a Lifecycle event type.
var ErrUnknownType = errors.New("want started, died or removed (or ContainerStarted, ContainerDied, ContainerRemoved)")

// lifecycleTypes are the Lifecycle event types with their short forms. The
// CLI's --type takes its names from ParseType, so the Go API and the CLI
// accept the same ones.
var lifecycleTypes = [...]struct{ name, short string }{
	{"ContainerStarted", "started"},
	{"ContainerDied", "died"},
	{"ContainerRemoved", "removed"},
}

// ParseType returns the Lifecycle event type ("ContainerDied") named by s,
// without regard to case or surrounding space: a short form ("died"), a
// Lifecycle event type ("ContainerDied") or a CloudEvent type
// ("pleg.v1.ContainerDied"). Anything else is an error wrapping
// ErrUnknownType. These are the names `pleg-bridge tail --type` accepts.
func ParseType(s string) (string, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimPrefix(t, "pleg.v1.")
	t = strings.TrimPrefix(t, "container")
	for _, lt := range lifecycleTypes {
		if t == lt.short {
			return lt.name, nil
		}
	}
	return "", fmt.Errorf("type %q: %w", s, ErrUnknownType)
}

// lifecycleType returns the Lifecycle event type named by a Filter's Type,
// "" for "".
func lifecycleType(t string) (string, error) {
	if t == "" {
		return "", nil
	}
	typ, err := ParseType(t)
	if err != nil {
		return "", fmt.Errorf("filter %w", err)
	}
	return typ, nil
}
