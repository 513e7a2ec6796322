package publish

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// TestHandWrittenDataCoversEveryField fails when schemas.EventData gains,
// loses or changes a field: appendData writes the fields listed here, and
// the differential tests only compare what encodeWithSDK's data maps. A
// change to the type must be made to both and to this list.
func TestHandWrittenDataCoversEveryField(t *testing.T) {
	t.Parallel()
	want := []string{
		`node`,
		`pod`,
		`pod.uid`,
		`pod.namespace,omitempty`,
		`pod.name,omitempty`,
		`pod.labels,omitzero`,
		`pod.annotations,omitzero`,
		`container`,
		`container.id`,
		`container.name,omitempty`,
		`container.attempt`,
		`container.sandbox`,
		`container.image,omitempty`,
		`container.imageRef,omitempty`,
		`state`,
		`exitCode,omitempty`,
		`reason,omitempty`,
		`message,omitempty`,
		`startedAt,omitempty`,
		`finishedAt,omitempty`,
		`detectedBy`,
		`observedAt`,
	}
	var got []string
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for f := range typ.Fields() {
			tag := prefix + f.Tag.Get("json")
			got = append(got, tag)
			// Pod and Container, not time.Time.
			if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == typ.PkgPath() {
				name, _, _ := strings.Cut(tag, ",")
				walk(name+".", f.Type)
			}
		}
	}
	walk("", reflect.TypeFor[schemas.EventData]())
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("schemas.EventData's JSON fields are not the ones appendData writes (-written +EventData):\n%s", diff)
	}
}

// TestEncodeAllocatesItsBufferOnce checks that the size Encode allocates
// holds the whole message when nothing needs escaping, with every field
// at its longest and for random names.
func TestEncodeAllocatesItsBufferOnce(t *testing.T) {
	t.Parallel()
	longest := sdkTestEvent()
	longest.Type = generator.ContainerRemoved
	longest.ExitCode, longest.Container.Attempt = exitCodeOf(math.MinInt32), math.MaxUint32
	longest.State, longest.DetectedBy = generator.StateUnknown, generator.SourceEvented
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	longest.StartedAt, longest.FinishedAt, longest.Time, longest.ObservedAt = at, at, at, at
	events := []generator.Event{sdkTestEvent(), longest}

	r := rand.New(rand.NewPCG(3, 5))
	word := func() string {
		const letters = "abcdefghijklmnopqrstuvwxyz0123456789-./"
		b := make([]byte, r.IntN(64))
		for i := range b {
			b[i] = letters[r.IntN(len(letters))]
		}
		return string(b)
	}
	for range 200 {
		ev := longest
		ev.Pod.UID, ev.Pod.Namespace, ev.Pod.Name = word()+"u", word(), word()
		ev.Container.ID, ev.Container.Name, ev.Container.Image, ev.Container.ImageRef = word()+"c", word(), word(), word()
		ev.Reason, ev.Message = word(), word()
		labels, annotations := map[string]string{}, map[string]string{}
		for range r.IntN(30) {
			labels[word()] = word()
			annotations[word()] = word()
		}
		ev.Pod.Meta = generator.NewPodMeta(labels, annotations)
		events = append(events, ev)
	}
	for _, names := range [][2]string{{"n", ""}, {strings.Repeat("node-", 50), strings.Repeat("cluster-", 30)}} {
		for _, e := range bothModes(t, names[0], names[1]) {
			for _, ev := range events {
				msg, err := e.Encode(ev)
				if err != nil {
					t.Fatalf("Encode(%s): %v", describe(ev), err)
				}
				want := e.structuredSize(ev)
				if e.mode == ModeBinary {
					want = e.dataSize(ev)
				}
				if cap(msg.Data) != want {
					t.Fatalf("%s Encode(%s): body of %d bytes grew its buffer from %d to %d", e.mode, describe(ev), len(msg.Data), want, cap(msg.Data))
				}
			}
		}
	}
}
