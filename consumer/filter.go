package consumer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Filter selects events by node, pod and Lifecycle event type. An empty
// field matches anything.
type Filter struct {
	// Node is the raw node name, as in the node extension.
	Node string
	// PodUID is the pod's UID.
	PodUID string
	// Type is a Lifecycle event type: "ContainerStarted", "ContainerDied"
	// or "ContainerRemoved". The short forms of `pleg-bridge tail --type`
	// ("started", "died", "removed", in any case) and the CloudEvent type
	// ("pleg.v1.ContainerDied") are accepted too: see ParseType.
	Type string
}

// Subject returns the JetStream filter subject that selects the filter's
// events under prefix: "pleg.>" for everything,
// "pleg.node-1.>" for one node, "pleg.*.<uid>.>" for one pod,
// "pleg.*.*.ContainerDied" for one type. Node and PodUID are encoded with
// schemas.EncodeToken, so names with dots or other odd bytes match exactly
// their own events. It returns an error if prefix is not a valid subject
// prefix, or one wrapping ErrUnknownType if Type is not a Lifecycle event
// type.
func (f Filter) Subject(prefix string) (string, error) {
	if err := schemas.ValidatePrefix(prefix); err != nil {
		return "", fmt.Errorf("subject prefix: %w", err)
	}
	typ, err := lifecycleType(f.Type)
	if err != nil {
		return "", err
	}
	tokens := []string{prefix, "*", "*", "*"}
	if f.Node != "" {
		tokens[1] = schemas.EncodeToken(f.Node)
	}
	if f.PodUID != "" {
		tokens[2] = schemas.EncodeToken(f.PodUID)
	}
	if typ != "" {
		tokens[3] = typ
	}
	// Trailing "*" tokens become one ">", the form the README documents for
	// subscribers.
	n := len(tokens)
	for n > 1 && tokens[n-1] == "*" {
		n--
	}
	if n < len(tokens) {
		return strings.Join(tokens[:n], ".") + ".>", nil
	}
	return strings.Join(tokens, "."), nil
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
