package main

import (
	"fmt"
	"strings"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// eventFilter selects events by what their NATS subjects do not carry: the
// pod's namespace and name and the container's name. tail and replay check
// it on each decoded event, after the server has applied the
// consumer.Filter of the node, pod UID and type, so a filter on names
// alone reads every event the server sends. The zero value matches every
// event.
type eventFilter struct {
	namespace string
	pod       string // the pod's name, not its UID
	container string
}

// match reports whether e is selected.
func (f eventFilter) match(e consumer.Event) bool {
	ns, pod, container := eventNames(e)
	return (f.namespace == "" || f.namespace == ns) &&
		(f.pod == "" || f.pod == pod) &&
		(f.container == "" || f.container == container)
}

// eventNames returns the namespace, pod and container names of e from its
// data, or, for an event whose data lacks them, from its CloudEvent subject
// "<namespace>/<pod>/<container>". A sandbox has no container name.
func eventNames(e consumer.Event) (namespace, pod, container string) {
	p, c := e.Data.Pod, e.Data.Container
	if p.Namespace != "" && p.Name != "" {
		if c.Sandbox {
			return p.Namespace, p.Name, ""
		}
		return p.Namespace, p.Name, c.Name
	}
	parts := strings.SplitN(e.Subject, "/", 3)
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	return parts[0], parts[1], parts[2]
}

// parsePod reads the value of --pod: a pod UID, or namespace/name.
func parsePod(s string) (uid, namespace, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return s, "", "", nil
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", "", fmt.Errorf("--pod %q: want a pod UID or namespace/name", s)
	}
	return "", ns, name, nil
}

// parseType reads the value of --type with consumer.ParseType, so the CLI
// and consumer.Filter accept the same names: a short form (died), a
// Lifecycle event type (ContainerDied) or a CloudEvent type
// (pleg.v1.ContainerDied), in any case. It returns the Lifecycle event type.
func parseType(s string) (string, error) {
	t, err := consumer.ParseType(s)
	if err != nil {
		return "", fmt.Errorf("--type %q: %w", s, consumer.ErrUnknownType)
	}
	return t, nil
}

// isUID reports whether s has the shape of a Kubernetes object UID (an
// RFC 4122 UUID in its text form).
func isUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, r := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if r != '-' {
				return false
			}
		case !strings.ContainsRune("0123456789abcdefABCDEF", r):
			return false
		}
	}
	return true
}
