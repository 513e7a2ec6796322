package jsonenc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

func FuzzAppendStringMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "\"\\/<>&", "\x00\x07\b\f\n\r\t\x1f\x7f", "\xff\xc3", "ä€😀", "a\u2028b\u2029"} {
		f.Add(s, s+"k")
	}
	f.Fuzz(func(t *testing.T, s, k string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("AppendString(%q) = %s, want %s", s, got, want)
		}
		m := map[string]string{s: k, k: s, "z": s}
		if want, _ := json.Marshal(m); !bytes.Equal(AppendStringMap(nil, m), want) {
			t.Errorf("AppendStringMap(%q) = %s, want %s", m, AppendStringMap(nil, m), want)
		}
	})
}

func TestAppendTimeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, tm := range []time.Time{
		time.Unix(0, 0).UTC(), time.Unix(1_800_000_000, 120_000_000).UTC(), time.Unix(1_800_000_000, 1).In(time.FixedZone("", -3*3600-1800)),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		want, wantErr := json.Marshal(tm)
		got, gotErr := AppendTime(nil, tm)
		if (wantErr == nil) != (gotErr == nil) || !bytes.Equal(got, want) {
			t.Errorf("AppendTime(%v) = %s, %v; encoding/json %s, %v", tm, got, gotErr, want, wantErr)
		}
	}
}

// BenchmarkAppendString escapes what an event's strings are like: IDs,
// names and images that need no escaping, and a termination message that
// does.
func BenchmarkAppendString(b *testing.B) {
	for _, s := range []string{
		"6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70",
		"registry.k8s.io/e2e-test-images/agnhost:2.53@sha256:99c6b4bb4a1e1df3f0b3f1a5bbd0b9f1e6c8c3b2a7e4d5f6a1b2c3d4e5f6a7b8",
		"exit status 2: \"boom\" <in main>\n\tat line 3",
	} {
		b.Run(fmt.Sprintf("%d bytes", len(s)), func(b *testing.B) {
			buf := make([]byte, 0, 256)
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				buf = AppendString(buf[:0], s)
			}
		})
	}
}
