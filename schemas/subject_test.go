package schemas_test

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

func TestEncodeToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"a plain node name is kept", "node-1", "node-1"},
		{"a pod UID is kept", "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70"},
		{"the empty string becomes a lone percent sign", "", "%"},
		{"dots become underscores", "ip-10-0-0-1.ec2.internal", "ip-10-0-0-1_ec2_internal"},
		{"a star is escaped", "a*b", "a%2Ab"},
		{"a greater-than sign is escaped", ">", "%3E"},
		{"a space is escaped", "a b", "a%20b"},
		{"an underscore is escaped so it cannot be read as a dot", "a_b", "a%5Fb"},
		{"a percent sign is escaped", "100%", "100%25"},
		{"a NUL byte is escaped", "\x00", "%00"},
		{"multi-byte UTF-8 is escaped byte by byte in uppercase hex", "né", "n%C3%A9"},
		{"invalid UTF-8 is escaped", "\xff", "%FF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := schemas.EncodeToken(tt.in); got != tt.want {
				t.Errorf("EncodeToken(%q) = %q, want %q", tt.in, got, tt.want)
			}
			got, err := schemas.DecodeToken(tt.want)
			if err != nil || got != tt.in {
				t.Errorf("DecodeToken(%q) = %q, %v; want %q, nil", tt.want, got, err, tt.in)
			}
		})
	}
}

func TestDecodeTokenRejectsWhatEncodeTokenCannotProduce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tok  string
	}{
		{"an empty token", ""},
		{"a raw dot", "a.b"},
		{"a raw star", "*"},
		{"a raw greater-than sign", "a>"},
		{"a raw space", "a b"},
		{"a raw non-ASCII byte", "né"},
		{"a percent sign at the end", "a%"},
		{"an escape with one digit", "%2"},
		{"an escape in lowercase hex", "%2a"},
		{"an escape of non-hex digits", "%ZZ"},
		{"two percent signs", "%%"},
		{"an escape of a letter that is kept", "%41"},
		{"an escape of a hyphen that is kept", "%2D"},
		{"an escape of a dot, which is written as an underscore", "%2E"},
		{"a lone percent sign followed by more", "%a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := schemas.DecodeToken(tt.tok)
			if err == nil {
				t.Fatalf("DecodeToken(%q) = %q, nil; want an error", tt.tok, got)
			}
			if !errors.Is(err, schemas.ErrInvalidToken) {
				t.Errorf("DecodeToken(%q) error %v does not wrap ErrInvalidToken", tt.tok, err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(tt.tok)) {
				t.Errorf("DecodeToken(%q) error %q does not name the token", tt.tok, err)
			}
		})
	}
}

// checkToken fails t unless tok is a well-formed encoding of s: only bytes
// from [A-Za-z0-9_%-] (so no '.', '*', '>' or whitespace), and it decodes
// back to s.
func checkToken(t *testing.T, s string) {
	t.Helper()
	tok := schemas.EncodeToken(s)
	if tok == "" {
		t.Fatalf("EncodeToken(%q) is empty", s)
	}
	for i := 0; i < len(tok); i++ {
		b := tok[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_' || b == '%') {
			t.Fatalf("EncodeToken(%q) = %q has byte %q at %d", s, tok, b, i)
		}
	}
	got, err := schemas.DecodeToken(tok)
	if err != nil || got != s {
		t.Fatalf("DecodeToken(EncodeToken(%q)) = %q, %v; want the input back", s, got, err)
	}
}

func TestTokenRoundTripOverArbitraryBytes(t *testing.T) {
	t.Parallel()
	t.Run("every one- and two-byte string", func(t *testing.T) {
		t.Parallel()
		for a := range 256 {
			checkToken(t, string([]byte{byte(a)}))
			for b := range 256 {
				checkToken(t, string([]byte{byte(a), byte(b)}))
			}
		}
	})
	t.Run("random strings up to 64 bytes", func(t *testing.T) {
		t.Parallel()
		r := rand.New(rand.NewPCG(1, 2))
		for range 5000 {
			b := make([]byte, r.IntN(65))
			for i := range b {
				b[i] = byte(r.UintN(256))
			}
			checkToken(t, string(b))
		}
	})
}

func FuzzTokenRoundTrip(f *testing.F) {
	for _, s := range []string{"", "node-1", "a.b", "*", ">", " \t\n", "%", "%41", "_", "né", "\xff\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkToken(t, s)
		// The mapping is one to one: whatever decodes is the only encoding
		// of its result.
		if dec, err := schemas.DecodeToken(s); err == nil {
			if enc := schemas.EncodeToken(dec); enc != s {
				t.Fatalf("DecodeToken(%q) = %q, which encodes as %q", s, dec, enc)
			}
		}
	})
}

func TestEncodeTokenAllocations(t *testing.T) {
	// Not parallel: AllocsPerRun measures the whole process.
	tests := []struct {
		name string
		in   string
		want float64
	}{
		{"a name that needs no escaping allocates nothing", "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", 0},
		{"the empty string allocates nothing", "", 0},
		{"a name that needs escaping allocates once", "ip-10-0-0-1.ec2.internal", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := testing.AllocsPerRun(100, func() { _ = schemas.EncodeToken(tt.in) })
			if got != tt.want {
				t.Errorf("EncodeToken(%q) allocates %v times, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func BenchmarkEncodeToken(b *testing.B) {
	for _, in := range []string{"6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", "ip-10-0-0-1.ec2.internal"} {
		b.Run(in, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = schemas.EncodeToken(in)
			}
		})
	}
}

func TestSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                       string
		prefix, node, ns, uid, typ string
		want                       string
	}{
		{
			name:   "the design's example subject",
			prefix: "pleg", node: "node-1", ns: "shop", uid: "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", typ: "ContainerDied",
			want: "pleg.node-1.shop.6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70.ContainerDied",
		},
		{
			name:   "a dotted node name stays one token",
			prefix: "pleg", node: "ip-10-0-0-1.ec2.internal", ns: "kube-system", uid: "u1", typ: "ContainerStarted",
			want: "pleg.ip-10-0-0-1_ec2_internal.kube-system.u1.ContainerStarted",
		},
		{
			name:   "a multi-token prefix is kept and wildcards in names are escaped",
			prefix: "prod.pleg", node: "*", ns: "a.b", uid: ">", typ: "ContainerRemoved",
			want: "prod.pleg.%2A.a_b.%3E.ContainerRemoved",
		},
		{
			name:   "empty names still give five or more tokens",
			prefix: "pleg", node: "", ns: "", uid: "", typ: "ContainerDied",
			want: "pleg.%.%.%.ContainerDied",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := schemas.Subject(tt.prefix, tt.node, tt.ns, tt.uid, tt.typ)
			if got != tt.want {
				t.Fatalf("Subject(%q, %q, %q, %q, %q) = %q, want %q", tt.prefix, tt.node, tt.ns, tt.uid, tt.typ, got, tt.want)
			}
			parts, err := schemas.ParseSubject(tt.prefix, got)
			if err != nil {
				t.Fatalf("ParseSubject(%q, %q): %v", tt.prefix, got, err)
			}
			want := schemas.SubjectParts{Node: tt.node, Namespace: tt.ns, PodUID: tt.uid, Type: tt.typ}
			if diff := cmp.Diff(want, parts); diff != "" {
				t.Errorf("ParseSubject(%q, %q) (-want +got):\n%s", tt.prefix, got, diff)
			}

			legacy := schemas.LegacySubject(tt.prefix, tt.node, tt.uid, tt.typ)
			parts, err = schemas.ParseSubject(tt.prefix, legacy)
			if err != nil {
				t.Fatalf("ParseSubject(%q, %q): %v", tt.prefix, legacy, err)
			}
			want = schemas.SubjectParts{Node: tt.node, PodUID: tt.uid, Type: tt.typ, Legacy: true}
			if diff := cmp.Diff(want, parts); diff != "" {
				t.Errorf("ParseSubject(%q, %q), a legacy subject (-want +got):\n%s", tt.prefix, legacy, diff)
			}
		})
	}
}

func TestParseSubjectRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		prefix    string
		subject   string
		wantToken bool // the error wraps ErrInvalidToken
	}{
		{name: "a subject under another prefix", prefix: "pleg", subject: "other.node-1.ns.u1.ContainerDied"},
		{name: "a subject whose first token only starts with the prefix", prefix: "pleg", subject: "plegx.node-1.ns.u1.ContainerDied"},
		{name: "too few tokens", prefix: "pleg", subject: "pleg.node-1.ContainerDied"},
		{name: "too many tokens", prefix: "pleg", subject: "pleg.a.node-1.ns.u1.ContainerDied"},
		{name: "an empty event type", prefix: "pleg", subject: "pleg.node-1.ns.u1."},
		{name: "a wildcard event type", prefix: "pleg", subject: "pleg.node-1.ns.u1.*"},
		{name: "a wildcard event type, legacy layout", prefix: "pleg", subject: "pleg.node-1.u1.>"},
		{name: "an invalid prefix", prefix: "pleg.>", subject: "pleg.>.node-1.ns.u1.ContainerDied"},
		{name: "a node token that does not decode", prefix: "pleg", subject: "pleg.%41.ns.u1.ContainerDied", wantToken: true},
		{name: "a namespace token that does not decode", prefix: "pleg", subject: "pleg.node-1.*.u1.ContainerDied", wantToken: true},
		{name: "a pod UID token that does not decode", prefix: "pleg", subject: "pleg.node-1.ns.*.ContainerDied", wantToken: true},
		{name: "a pod UID token that does not decode, legacy layout", prefix: "pleg", subject: "pleg.node-1.*.ContainerDied", wantToken: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			parts, err := schemas.ParseSubject(tt.prefix, tt.subject)
			if err == nil {
				t.Fatalf("ParseSubject(%q, %q) = %+v, nil; want an error", tt.prefix, tt.subject, parts)
			}
			if got := errors.Is(err, schemas.ErrInvalidToken); got != tt.wantToken {
				t.Errorf("ParseSubject(%q, %q) error %v: wraps ErrInvalidToken = %v, want %v", tt.prefix, tt.subject, err, got, tt.wantToken)
			}
		})
	}
}

func TestValidatePrefix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		prefix string
		ok     bool
	}{
		{"the default prefix is valid", "pleg", true},
		{"several tokens are valid", "prod.eu-1.pleg", true},
		{"an empty prefix is invalid", "", false},
		{"a leading dot is invalid", ".pleg", false},
		{"a trailing dot is invalid", "pleg.", false},
		{"two dots in a row are invalid", "prod..pleg", false},
		{"a star token is invalid", "pleg.*", false},
		{"a greater-than token is invalid", "pleg.>", false},
		{"a star inside a token is invalid", "pl*eg", false},
		{"a space is invalid", "pleg events", false},
		{"a tab is invalid", "pleg\t", false},
		{"a control byte is invalid", "pleg\x01", false},
		{"a non-breaking space is invalid", "pleg\u00a0x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := schemas.ValidatePrefix(tt.prefix)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidatePrefix(%q) = %v, want ok %v", tt.prefix, err, tt.ok)
			}
			if err != nil && !strings.Contains(err.Error(), strconv.Quote(tt.prefix)) {
				t.Errorf("ValidatePrefix(%q) error %q does not name the prefix", tt.prefix, err)
			}
		})
	}
}
