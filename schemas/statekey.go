package schemas

import (
	"errors"
	"fmt"
	"strings"
)

// DefaultStateBucket is the JetStream key-value bucket that holds the
// current state of every container (PLEG_STATE_BUCKET), one key per
// container: a subscriber told nothing looks for it here.
const DefaultStateBucket = "PLEG_STATE"

// ErrInvalidKey is wrapped by the errors of DecodeKeyToken and ParseStateKey
// for a state key, or a token of one, that StateKey cannot have produced.
var ErrInvalidKey = errors.New("invalid state key")

// EncodeKeyToken encodes s as one token of a state bucket key. JetStream
// keys allow only [-/_=.A-Za-z0-9], so the subject encoding's %XX cannot be
// used; this is the same mapping with '=' as the escape: it keeps
// [A-Za-z0-9-], turns '.' into '_' and every other byte (also '/', '_' and
// '=') into =XX (uppercase hex), and encodes the empty string as "=". So a
// name that EncodeToken leaves without a '%' (every Kubernetes node name,
// namespace, pod name and UID, and every container ID) has the same token
// in a key as in a subject. The result is never empty and never contains
// '.', '*' or '>', and DecodeKeyToken reverses it.
func EncodeKeyToken(s string) string { return encodeToken(s, "=") }

// DecodeKeyToken returns the string that EncodeKeyToken encoded as tok. It
// rejects, with an error that names tok and wraps ErrInvalidKey, anything
// EncodeKeyToken cannot produce: the empty token, a byte outside
// [A-Za-z0-9_=-], an '=' not followed by two uppercase hex digits, or an
// escape of a byte that is kept or written as '_'. The mapping is one to
// one.
func DecodeKeyToken(tok string) (string, error) {
	return decodeToken(tok, "=", func(i int, reason string) error {
		return fmt.Errorf("decode key token %q: %w: %s at offset %d", tok, ErrInvalidKey, reason, i)
	})
}

// StateRef names one container in the state bucket: the five parts of its
// key, raw (not encoded).
type StateRef struct {
	Node        string
	Namespace   string
	Pod         string // the pod's name
	PodUID      string
	ContainerID string // for a sandbox, the sandbox ID
}

// StateKey returns the state bucket key of a container:
// <node>.<namespace>.<pod>.<podUID>.<containerID>, each part encoded by
// EncodeKeyToken. The order puts the coarse selections first, so that
// JetStream filters them on the server: "<node>.>" is one node,
// "*.<namespace>.>" one namespace, "*.<namespace>.<pod>.>" one pod by name,
// "*.*.*.<podUID>.*" one pod by UID.
func StateKey(r StateRef) string {
	return EncodeKeyToken(r.Node) + "." + EncodeKeyToken(r.Namespace) + "." + EncodeKeyToken(r.Pod) + "." +
		EncodeKeyToken(r.PodUID) + "." + EncodeKeyToken(r.ContainerID)
}

// StateKeyFilter returns the key filter that selects the containers of r's
// non-empty parts; "" parts match anything. All empty is ">", everything.
// Trailing wildcards are folded into one ">".
func StateKeyFilter(r StateRef) string {
	parts := []string{r.Node, r.Namespace, r.Pod, r.PodUID, r.ContainerID}
	toks := make([]string, len(parts))
	n := 0
	for i, p := range parts {
		toks[i] = "*"
		if p != "" {
			toks[i] = EncodeKeyToken(p)
			n = i + 1
		}
	}
	if n == len(toks) {
		return strings.Join(toks, ".")
	}
	return strings.Join(append(toks[:n], ">"), ".")
}

// ParseStateKey splits a key made by StateKey into its decoded parts. It
// fails, with an error wrapping ErrInvalidKey, for a key without exactly
// five tokens or with a token that does not decode.
func ParseStateKey(key string) (StateRef, error) {
	toks := strings.Split(key, ".")
	if len(toks) != 5 {
		return StateRef{}, fmt.Errorf("parse state key %q: %w: want 5 tokens, got %d", key, ErrInvalidKey, len(toks))
	}
	var parts [5]string
	for i, tok := range toks {
		s, err := DecodeKeyToken(tok)
		if err != nil {
			return StateRef{}, fmt.Errorf("parse state key %q: %w", key, err)
		}
		parts[i] = s
	}
	return StateRef{Node: parts[0], Namespace: parts[1], Pod: parts[2], PodUID: parts[3], ContainerID: parts[4]}, nil
}
