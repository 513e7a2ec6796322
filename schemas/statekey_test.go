package schemas_test

import (
	"errors"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// kvKey is what JetStream accepts as a key: [-/_=.A-Za-z0-9], no leading
// or trailing dot, no empty token (nats.go's keyValid).
var kvKey = regexp.MustCompile(`^[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*$`)

func TestEncodeKeyToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"a plain node name is kept", "node-1", "node-1"},
		{"a container ID is kept", "3b9f0c1d2e", "3b9f0c1d2e"},
		{"the empty string becomes a lone equals sign", "", "="},
		{"dots become underscores, as in subjects", "ip-10-0-0-1.ec2.internal", "ip-10-0-0-1_ec2_internal"},
		{"an underscore is escaped so it cannot be read as a dot", "a_b", "a=5Fb"},
		{"an equals sign is escaped", "a=b", "a=3Db"},
		{"a slash is escaped", "a/b", "a=2Fb"},
		{"a percent sign is escaped", "100%", "100=25"},
		{"wildcards are escaped", "*>", "=2A=3E"},
		{"multi-byte UTF-8 is escaped byte by byte", "né", "n=C3=A9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := schemas.EncodeKeyToken(tt.in); got != tt.want {
				t.Errorf("EncodeKeyToken(%q) = %q, want %q", tt.in, got, tt.want)
			}
			got, err := schemas.DecodeKeyToken(tt.want)
			if err != nil || got != tt.in {
				t.Errorf("DecodeKeyToken(%q) = %q, %v; want %q, nil", tt.want, got, err, tt.in)
			}
		})
	}
}

func TestKeyTokenEqualsSubjectTokenForKubernetesNames(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"node-1", "ip-10-0-0-1.ec2.internal", "kube-system", "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", "web-0"} {
		if k, sub := schemas.EncodeKeyToken(s), schemas.EncodeToken(s); k != sub {
			t.Errorf("%q: key token %q, subject token %q", s, k, sub)
		}
	}
}

func TestDecodeKeyTokenRejectsWhatEncodeKeyTokenCannotProduce(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{"", "a.b", "*", "a>", "a b", "né", "a=", "=2", "=2a", "=ZZ", "==", "=41", "=2D", "=2E", "a%20b", "a/b"} {
		t.Run(strconv.Quote(tok), func(t *testing.T) {
			t.Parallel()
			got, err := schemas.DecodeKeyToken(tok)
			if err == nil {
				t.Fatalf("DecodeKeyToken(%q) = %q, nil; want an error", tok, got)
			}
			if !errors.Is(err, schemas.ErrInvalidKey) || !strings.Contains(err.Error(), strconv.Quote(tok)) {
				t.Errorf("DecodeKeyToken(%q) error %v does not wrap ErrInvalidKey and name the token", tok, err)
			}
		})
	}
}

// checkKeyToken fails t unless the key token of s is a valid JetStream key
// token without dots and decodes back to s.
func checkKeyToken(t *testing.T, s string) {
	t.Helper()
	tok := schemas.EncodeKeyToken(s)
	if !kvKey.MatchString(tok) || strings.Contains(tok, ".") {
		t.Fatalf("EncodeKeyToken(%q) = %q is not one valid key token", s, tok)
	}
	got, err := schemas.DecodeKeyToken(tok)
	if err != nil || got != s {
		t.Fatalf("DecodeKeyToken(EncodeKeyToken(%q)) = %q, %v; want the input back", s, got, err)
	}
}

func TestKeyTokenRoundTripOverArbitraryBytes(t *testing.T) {
	t.Parallel()
	for a := range 256 {
		checkKeyToken(t, string([]byte{byte(a)}))
		for b := range 256 {
			checkKeyToken(t, string([]byte{byte(a), byte(b)}))
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		b := make([]byte, r.IntN(65))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		checkKeyToken(t, string(b))
	}
}

func FuzzKeyTokenRoundTrip(f *testing.F) {
	for _, s := range []string{"", "node-1", "a.b", "*", ">", "=", "=41", "_", "/", "né", "\xff\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkKeyToken(t, s)
		if dec, err := schemas.DecodeKeyToken(s); err == nil {
			if enc := schemas.EncodeKeyToken(dec); enc != s {
				t.Fatalf("DecodeKeyToken(%q) = %q, which encodes as %q", s, dec, enc)
			}
		}
	})
}

func FuzzStateKeyRoundTrip(f *testing.F) {
	f.Add("node-1", "default", "web-0", "6f1c2a7e", "3b9f")
	f.Add("", "", "", "", "")
	f.Add("a.b", "c_d", "e=f", "g/h", "*>")
	f.Fuzz(func(t *testing.T, node, ns, pod, uid, cid string) {
		ref := schemas.StateRef{Node: node, Namespace: ns, Pod: pod, PodUID: uid, ContainerID: cid}
		key := schemas.StateKey(ref)
		if !kvKey.MatchString(key) {
			t.Fatalf("StateKey(%+v) = %q is not a valid JetStream key", ref, key)
		}
		got, err := schemas.ParseStateKey(key)
		if err != nil {
			t.Fatalf("ParseStateKey(%q): %v", key, err)
		}
		if diff := cmp.Diff(ref, got); diff != "" {
			t.Fatalf("ParseStateKey(StateKey(x)) (-want +got):\n%s", diff)
		}
	})
}

func TestStateKey(t *testing.T) {
	t.Parallel()
	ref := schemas.StateRef{Node: "ip-10-0-0-1.ec2.internal", Namespace: "shop", Pod: "web-0", PodUID: "6f1c2a7e", ContainerID: "3b9f"}
	want := "ip-10-0-0-1_ec2_internal.shop.web-0.6f1c2a7e.3b9f"
	if got := schemas.StateKey(ref); got != want {
		t.Errorf("StateKey = %q, want %q", got, want)
	}
	for _, key := range []string{"a.b.c.d", "a.b.c.d.e.f", "a.b.c.d.=41", "a..c.d.e"} {
		if _, err := schemas.ParseStateKey(key); !errors.Is(err, schemas.ErrInvalidKey) {
			t.Errorf("ParseStateKey(%q) = %v, want an error wrapping ErrInvalidKey", key, err)
		}
	}
}

func TestStateKeyFilterSelectsOnTheServerByPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ref  schemas.StateRef
		want string
	}{
		{"nothing selects everything", schemas.StateRef{}, ">"},
		{"a node is a prefix", schemas.StateRef{Node: "node-1.x"}, "node-1_x.>"},
		{"a namespace is the second token", schemas.StateRef{Namespace: "shop"}, "*.shop.>"},
		{"a pod by name is namespace and name", schemas.StateRef{Namespace: "shop", Pod: "web-0"}, "*.shop.web-0.>"},
		{"a pod by UID leaves the container open", schemas.StateRef{PodUID: "u1"}, "*.*.*.u1.>"},
		{"a node and a namespace", schemas.StateRef{Node: "n", Namespace: "shop"}, "n.shop.>"},
		{"every part is one key", schemas.StateRef{Node: "n", Namespace: "s", Pod: "p", PodUID: "u", ContainerID: "c"}, "n.s.p.u.c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := schemas.StateKeyFilter(tt.ref); got != tt.want {
				t.Errorf("StateKeyFilter(%+v) = %q, want %q", tt.ref, got, tt.want)
			}
		})
	}
}
