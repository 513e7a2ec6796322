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
// defines it: <prefix>.<node>.<podUID>.<eventType>, with node and podUID encoded by
// EncodeToken. prefix must have passed ValidatePrefix, and eventType is a
// lifecycle event name such as "ContainerDied"; neither is checked here.
func Subject(prefix, node, podUID, eventType string) string {
	return prefix + "." + EncodeToken(node) + "." + EncodeToken(podUID) + "." + eventType
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

// ParseSubject splits a subject made by Subject with the same prefix into
// the decoded node name, the decoded pod UID and the lifecycle event name.
// It fails if prefix is invalid, if the subject is not under prefix or does
// not have exactly three tokens after it, if the event name is empty or a
// wildcard, or if a token does not decode (the error wraps ErrInvalidToken).
func ParseSubject(prefix, subject string) (node, podUID, eventType string, err error) {
	if err := ValidatePrefix(prefix); err != nil {
		return "", "", "", err
	}
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", "", "", fmt.Errorf("parse subject %q: not under prefix %q", subject, prefix)
	}
	toks := strings.Split(rest, ".")
	if len(toks) != 3 {
		return "", "", "", fmt.Errorf("parse subject %q: want 3 tokens after prefix %q, got %d", subject, prefix, len(toks))
	}
	if eventType = toks[2]; eventType == "" || eventType == "*" || eventType == ">" {
		return "", "", "", fmt.Errorf("parse subject %q: event type %q", subject, eventType)
	}
	if node, err = DecodeToken(toks[0]); err != nil {
		return "", "", "", fmt.Errorf("parse subject %q: node: %w", subject, err)
	}
	if podUID, err = DecodeToken(toks[1]); err != nil {
		return "", "", "", fmt.Errorf("parse subject %q: pod UID: %w", subject, err)
	}
	return node, podUID, eventType, nil
}
