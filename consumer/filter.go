package consumer

import (
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
	// or "ContainerRemoved". The CloudEvent type ("pleg.v1.ContainerDied")
	// is accepted too.
	Type string
}

// Subject returns the JetStream filter subject that selects the filter's
// events under prefix: "pleg.>" for everything,
// "pleg.node-1.>" for one node, "pleg.*.<uid>.>" for one pod,
// "pleg.*.*.ContainerDied" for one type. Node and PodUID are encoded with
// schemas.EncodeToken, so names with dots or other odd bytes match exactly
// their own events. It returns an error if prefix is not a valid subject
// prefix or Type is not a Lifecycle event type.
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

// lifecycleType returns the Lifecycle event type named by t, "" for "".
func lifecycleType(t string) (string, error) {
	switch t {
	case "":
		return "", nil
	case "ContainerStarted", schemas.TypeContainerStarted:
		return "ContainerStarted", nil
	case "ContainerDied", schemas.TypeContainerDied:
		return "ContainerDied", nil
	case "ContainerRemoved", schemas.TypeContainerRemoved:
		return "ContainerRemoved", nil
	}
	return "", fmt.Errorf("filter type %q is not a Lifecycle event type (ContainerStarted, ContainerDied or ContainerRemoved)", t)
}
