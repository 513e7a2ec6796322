package datadir

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// randomRecord returns a record with each field set or not, strings from
// the troublesome ones (escapes, HTML characters, invalid UTF-8, line
// separators), times in several offsets and with and without nanoseconds.
func randomRecord(rng *rand.Rand) record {
	strs := []string{"", "web", "ä/ü \"q\" \\ <b>&amp;</b>", "\x00\x1f\t\n\r\b\f", "\xff\xfe bad", "a\u2028b\u2029c", strings.Repeat("x", 300)}
	str := func() string { return strs[rng.IntN(len(strs))] }
	tm := func() time.Time {
		switch rng.IntN(4) {
		case 0:
			return time.Time{}
		case 1:
			return time.Unix(rng.Int64N(4e9), 0).UTC()
		case 2:
			return time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(time.FixedZone("x", 5*3600+1800))
		}
		return time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).Local()
	}
	strMap := func() map[string]string {
		switch rng.IntN(3) {
		case 0:
			return nil
		case 1:
			return map[string]string{}
		}
		m := map[string]string{}
		for range rng.IntN(6) + 1 {
			m[str()] = str()
		}
		return m
	}
	r := record{
		Type: generator.LifecycleEventType(str()), PodUID: str(), Namespace: str(), PodName: str(),
		PodLabels: strMap(), PodAnnotations: strMap(), ID: str(), Name: str(), Attempt: uint32(rng.IntN(3)) * 4_000_000_000 / 2,
		Sandbox: rng.IntN(2) == 0, Image: str(), ImageRef: str(), State: generator.State(str()),
		Reason: str(), Message: str(), StartedAt: tm(), FinishedAt: tm(), Time: tm(),
		DetectedBy: generator.Source(str()), ObservedAt: tm(),
	}
	if rng.IntN(2) == 0 {
		code := int32(rng.Int64N(1<<32) - 1<<31)
		r.ExitCode = &code
	}
	return r
}

// TestEncodeRecordMatchesEncodingJSON holds the hand-written encoding to
// encoding/json's, byte for byte, so that either reads what the other
// wrote.
func TestEncodeRecordMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		r := randomRecord(rng)
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeRecord(r)
		if err != nil {
			t.Fatalf("encodeRecord(%+v): %v", r, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encodeRecord(%+v)\n got %s\nwant %s", r, got, want)
		}
	}
}

// TestEncodeRecordRefusesATimeJSONCannotWrite: as encoding/json, for a year
// past 9999.
func TestEncodeRecordRefusesATimeJSONCannotWrite(t *testing.T) {
	t.Parallel()
	r := record{Type: generator.ContainerDied, ID: "c", FinishedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if _, err := json.Marshal(r); err == nil {
		t.Fatal("encoding/json wrote the year 10000")
	}
	if b, err := encodeRecord(r); err == nil {
		t.Errorf("encodeRecord wrote the year 10000: %s", b)
	}
}

// FuzzEncodeRecordMatchesEncodingJSON: for any strings and times.
func FuzzEncodeRecordMatchesEncodingJSON(f *testing.F) {
	f.Add("ContainerDied", "uid", "c1", "app", "<&>\u2028", "\xff", int64(1_700_000_000_123_456_789), int32(-1), true)
	f.Add("", "", "", "", "", "", int64(0), int32(0), false)
	f.Fuzz(func(t *testing.T, typ, uid, id, name, msg, label string, ns int64, code int32, sandbox bool) {
		r := record{Type: generator.LifecycleEventType(typ), PodUID: uid, ID: id, Name: name, Message: msg, Sandbox: sandbox,
			PodLabels: map[string]string{label: msg, name: label}, ExitCode: &code, FinishedAt: time.Unix(0, ns)}
		want, wantErr := json.Marshal(r)
		got, gotErr := encodeRecord(r)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("errors differ: encoding/json %v, encodeRecord %v", wantErr, gotErr)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encodeRecord\n got %s\nwant %s", got, want)
		}
	})
}

// BenchmarkEncodeRecord compares a checkpoint record's encoding by
// encoding/json and by hand.
func BenchmarkEncodeRecord(b *testing.B) {
	code := int32(137)
	at := time.Unix(1_800_000_000, 123456789).UTC()
	r := record{Type: generator.ContainerDied, PodUID: "3f1c2b9e-5d4a-4c1b-9a8e-2b7f6c5d4e3f", Namespace: "payments", PodName: "checkout-7d9f8b6c5-x2kqz",
		ID: strings.Repeat("ab", 32), Name: "app", Attempt: 1, Image: "registry.example.com/payments/checkout:1.42.0",
		ImageRef: "registry.example.com/payments/checkout@sha256:" + strings.Repeat("0f", 32), State: generator.StateExited,
		ExitCode: &code, Reason: "OOMKilled", StartedAt: at, FinishedAt: at, Time: at, DetectedBy: generator.SourceEvented, ObservedAt: at}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("by-hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodeRecord(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
