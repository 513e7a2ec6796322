package schemas

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// ErrInvalidToken is wrapped by the errors of DecodeToken and ParseSubject
// for a subject token that EncodeToken cannot have produced.
var ErrInvalidToken = errors.New("invalid subject token")

const upperHex = "0123456789ABCDEF"

// keep reports whether EncodeToken keeps b as it is.
func keep(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-'
}

// EncodeToken encodes s as one NATS subject token of the contract: it keeps
// [A-Za-z0-9-], turns '.' into '_' and every other byte into %XX (uppercase
// hex), and encodes the empty string as "%". The result never contains '.',
// '*', '>' or whitespace, and DecodeToken reverses it. Kubernetes node names
// and UIDs contain no '_' or '%', so they stay readable.
//
// A string that needs no escaping, like every pod UID, is returned as it is
// without allocating.
func EncodeToken(s string) string { return encodeToken(s, "%") }

// encodeToken is the one token mapping, with its escape (one byte): '%' in
// subjects, '=' in state keys (which cannot hold '%'). It keeps
// [A-Za-z0-9-], turns '.' into '_' and every other byte into esc and two
// uppercase hex digits, and encodes the empty string as esc alone.
func encodeToken(s, esc string) string {
	if s == "" {
		return esc
	}
	i := 0
	for i < len(s) && keep(s[i]) {
		i++
	}
	if i == len(s) {
		return s
	}
	n := len(s) // length of the encoded token: 2 more per escape
	for ; i < len(s); i++ {
		if b := s[i]; !keep(b) && b != '.' {
			n += 2
		}
	}
	var sb strings.Builder
	sb.Grow(n)
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case keep(b):
			sb.WriteByte(b)
		case b == '.':
			sb.WriteByte('_')
		default:
			sb.WriteString(esc)
			sb.WriteByte(upperHex[b>>4])
			sb.WriteByte(upperHex[b&0x0f])
		}
	}
	return sb.String()
}

// DecodeToken returns the string that EncodeToken encoded as tok. It rejects,
// with an error that names tok and wraps ErrInvalidToken, anything
// EncodeToken cannot produce: the empty token, a byte outside [A-Za-z0-9_%-],
// a '%' not followed by two uppercase hex digits, or an escape of a byte that
// EncodeToken keeps or turns into '_' (like "%41" for "A").
func DecodeToken(tok string) (string, error) {
	return decodeToken(tok, "%", func(i int, reason string) error {
		return fmt.Errorf("decode %q: %w: %s at offset %d", tok, ErrInvalidToken, reason, i)
	})
}

// decodeToken reverses encodeToken with the escape esc, reporting
// what it refuses through fail (called with the offset and the reason).
func decodeToken(tok, esc string, fail func(i int, reason string) error) (string, error) {
	switch tok {
	case "":
		return "", fail(0, "empty")
	case esc:
		return "", nil
	}
	if strings.IndexByte(tok, '_') < 0 && !strings.Contains(tok, esc) {
		for i := 0; i < len(tok); i++ {
			if !keep(tok[i]) {
				return "", fail(i, "byte not allowed")
			}
		}
		return tok, nil
	}
	buf := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		switch b := tok[i]; {
		case keep(b):
			buf = append(buf, b)
		case b == '_':
			buf = append(buf, '.')
		case b == esc[0]:
			if i+2 >= len(tok) {
				return "", fail(i, "incomplete escape")
			}
			hi, ok1 := unhex(tok[i+1])
			lo, ok2 := unhex(tok[i+2])
			if !ok1 || !ok2 {
				return "", fail(i, "escape is not two uppercase hex digits")
			}
			d := hi<<4 | lo
			if keep(d) || d == '.' {
				return "", fail(i, "escape of a byte that is never escaped")
			}
			buf = append(buf, d)
			i += 2
		default:
			return "", fail(i, "byte not allowed")
		}
	}
	return string(buf), nil
}

// unhex returns the value of an uppercase hex digit.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Subject returns the NATS subject of a lifecycle event, as the contract
// defines it: <prefix>.<node>.<namespace>.<podUID>.<eventType>, with node,
// namespace and podUID encoded by EncodeToken. The order puts the node
// first, as in the state bucket's keys, so that a node's bridge may be
// limited to <prefix>.<node>.>, a namespace's readers to
// <prefix>.*.<namespace>.>, and one wildcard selects one namespace across
// nodes, one pod (<prefix>.*.*.<podUID>.*) or one type
// (<prefix>.*.*.*.<eventType>). prefix must have passed ValidatePrefix, and
// eventType is a lifecycle event name such as "ContainerDied"; neither is
// checked here.
func Subject(prefix, node, namespace, podUID, eventType string) string {
	return prefix + "." + EncodeToken(node) + "." + EncodeToken(namespace) + "." + EncodeToken(podUID) + "." + eventType
}

// LegacySubject returns the subject of a lifecycle event in the layout that
// bridges before the namespace token wrote: <prefix>.<node>.<podUID>.<eventType>.
// No bridge publishes it any more; ParseSubject and the consumer package
// still read it for as long as a stream keeps such events, and tests use it
// to write them.
func LegacySubject(prefix, node, podUID, eventType string) string {
	return prefix + "." + EncodeToken(node) + "." + EncodeToken(podUID) + "." + eventType
}

// SubjectParts are the decoded tokens of an event subject.
type SubjectParts struct {
	Node      string
	Namespace string // "" for a legacy subject, which has no namespace token
	PodUID    string
	Type      string // the lifecycle event name, "ContainerDied"
	// Legacy is true for a subject of the layout without the namespace
	// token (LegacySubject).
	Legacy bool
}

// ValidatePrefix checks a subject prefix: one or more non-empty tokens
// separated by '.', with no wildcard ('*', '>'), whitespace or control
// character. The error names the prefix.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("invalid subject prefix %q: empty", prefix)
	}
	for i, tok := range strings.Split(prefix, ".") {
		if tok == "" {
			return fmt.Errorf("invalid subject prefix %q: token %d is empty", prefix, i+1)
		}
	}
	for _, r := range prefix {
		switch {
		case r == '*' || r == '>':
			return fmt.Errorf("invalid subject prefix %q: wildcard %q", prefix, r)
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return fmt.Errorf("invalid subject prefix %q: whitespace or control character %q", prefix, r)
		}
	}
	return nil
}

// ParseSubject splits a subject made by Subject (or LegacySubject) with the
// same prefix into its decoded parts. The two layouts differ in their number
// of tokens after the prefix: four, or three for a legacy subject. It fails if
// prefix is invalid, if the subject is not under prefix or has another
// number of tokens after it, if the event name is empty or a wildcard, or if
// a token does not decode (the error wraps ErrInvalidToken).
func ParseSubject(prefix, subject string) (SubjectParts, error) {
	if err := ValidatePrefix(prefix); err != nil {
		return SubjectParts{}, err
	}
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return SubjectParts{}, fmt.Errorf("parse subject %q: not under prefix %q", subject, prefix)
	}
	toks := strings.Split(rest, ".")
	var p SubjectParts
	var uidTok string
	switch len(toks) {
	case 4:
		ns, err := DecodeToken(toks[1])
		if err != nil {
			return SubjectParts{}, fmt.Errorf("parse subject %q: namespace: %w", subject, err)
		}
		p.Namespace, uidTok = ns, toks[2]
	case 3:
		p.Legacy, uidTok = true, toks[1]
	default:
		return SubjectParts{}, fmt.Errorf("parse subject %q: want 4 tokens after prefix %q (3 in the legacy layout), got %d", subject, prefix, len(toks))
	}
	if p.Type = toks[len(toks)-1]; p.Type == "" || p.Type == "*" || p.Type == ">" {
		return SubjectParts{}, fmt.Errorf("parse subject %q: event type %q", subject, p.Type)
	}
	var err error
	if p.Node, err = DecodeToken(toks[0]); err != nil {
		return SubjectParts{}, fmt.Errorf("parse subject %q: node: %w", subject, err)
	}
	if p.PodUID, err = DecodeToken(uidTok); err != nil {
		return SubjectParts{}, fmt.Errorf("parse subject %q: pod UID: %w", subject, err)
	}
	return p, nil
}
