// Package jsonenc appends JSON values to a byte slice exactly as
// encoding/json writes them, without reflection: for the hand-written
// encoders of the bridge's hot paths (the CloudEvent's data in publish, the
// durable state's records), which their tests hold byte for byte to
// encoding/json.
package jsonenc

import (
	"slices"
	"time"
	"unicode/utf8"
)

// AppendTime appends t as time.Time.MarshalJSON writes it (RFC 3339 with
// the nanoseconds it has, in t's own offset). Like it, it fails for a year
// outside 0-9999, which RFC 3339 cannot write.
func AppendTime(b []byte, t time.Time) ([]byte, error) {
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return nil, err
	}
	return append(b, '"'), nil
}

// AppendStringMap appends m as encoding/json writes a map[string]string:
// keys in byte order, keys and values escaped as strings. A nil map is
// written as {}; the caller leaves out what encoding/json's omitzero
// leaves out.
func AppendStringMap(b []byte, m map[string]string) []byte {
	// Pods carry a handful of labels; the array keeps their keys off the
	// heap.
	var array [16]string
	keys := array[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, k)
		b = append(b, ':')
		b = AppendString(b, m[k])
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string, quoted and escaped as
// encoding/json writes it (AppendEscaped).
func AppendString(b []byte, s string) []byte {
	b = append(b, '"')
	b = AppendEscaped(b, s)
	return append(b, '"')
}

// plain holds the bytes AppendEscaped copies as they are without looking
// further: ASCII from the space on, but for '"', '\\' and the HTML
// characters. A table rather than six comparisons a byte: escaping was a
// third of encoding an event (BenchmarkAppendString, BenchmarkEncode).
var plain = func() (t [256]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// AppendEscaped appends s escaped as encoding/json escapes a string, without
// the quotes: '"' and '\' with a backslash; \b, \f, \n, \r and \t short;
// the other control characters and the HTML characters <, > and & as
// \u00XX; each byte of invalid UTF-8 as \ufffd; U+2028 and U+2029 as
// \u2028 and \u2029. Everything else is copied.
func AppendEscaped(b []byte, s string) []byte {
	start := 0 // s[start:i] is still to be copied
	for i := 0; i < len(s); {
		c := s[i]
		if plain[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}
