package publish

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// encodeWithSDK is Encode as it was before it wrote JSON by hand, kept as
// the reference the hand-written JSON is held to: the CloudEvent built as
// an SDK event.Event, its data marshalled by encoding/json, and the
// structured envelope written by event.WriteJson. Error messages aside, it
// is the old code.
func encodeWithSDK(e *Encoder, ev generator.Event) (*nats.Msg, error) {
	info, ok := e.types[ev.Type]
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown Lifecycle event type %q", ev.Type)
	case ev.Container.ID == "":
		return nil, errors.New("container ID is empty")
	case ev.Pod.UID == "":
		return nil, errors.New("pod UID is empty")
	case ev.ObservedAt.IsZero():
		return nil, errors.New("observed time is zero")
	}
	when := ev.Time
	if when.IsZero() {
		when = ev.ObservedAt
	}
	subject := ceSubject(ev)
	ce := event.Event{Context: &event.EventContextV1{
		ID:              EventID(ev.Container.ID, ev.Type),
		Source:          e.sourceRef,
		Type:            info.ceType,
		DataContentType: &jsonContentType,
		Subject:         &subject,
		Time:            &types.Timestamp{Time: when.UTC()},
		DataSchema:      info.dataSchemaRef,
		Extensions: map[string]any{
			"poduid":      ev.Pod.UID,
			"node":        e.node,
			"containerid": ev.Container.ID,
		},
	}}
	data := e.data(ev)
	encoded, err := json.Marshal(&data)
	if err != nil {
		return nil, fmt.Errorf("marshal data: %w", err)
	}
	ce.DataEncoded = encoded

	msg := &nats.Msg{Subject: schemas.Subject(e.prefix, e.node, ev.Pod.Namespace, ev.Pod.UID, string(ev.Type))}
	if e.mode == ModeBinary {
		msg.Header = binaryHeaders(&ce)
		msg.Data = ce.DataEncoded
		return msg, nil
	}
	var body bytes.Buffer
	if err := event.WriteJson(&ce, &body); err != nil {
		return nil, fmt.Errorf("marshal cloudevent: %w", err)
	}
	msg.Header = nats.Header{
		jetstream.MsgIDHeader: {ce.ID()},
		"Content-Type":        {contentTypeStructured},
	}
	msg.Data = body.Bytes()
	return msg, nil
}

// data maps ev to the data contract as encodeWithSDK did, for
// encoding/json to marshal. Unknown values stay out: a nil exit code, zero
// times and the labels of a pod whose sandbox was not seen are omitted,
// never written as zero.
func (e *Encoder) data(ev generator.Event) schemas.EventData {
	var labels, annotations map[string]string
	if m := ev.Pod.Meta; m != nil {
		labels, annotations = m.Labels, m.Annotations
		if labels == nil {
			labels = map[string]string{} // known: the sandbox has none
		}
	}
	return schemas.EventData{
		Node: e.node,
		Pod: schemas.Pod{
			UID:         ev.Pod.UID,
			Namespace:   ev.Pod.Namespace,
			Name:        ev.Pod.Name,
			Labels:      labels,
			Annotations: annotations,
		},
		Container: schemas.Container{
			ID:       ev.Container.ID,
			Name:     ev.Container.Name,
			Attempt:  ev.Container.Attempt,
			Sandbox:  ev.Container.Sandbox,
			Image:    ev.Container.Image,
			ImageRef: ev.Container.ImageRef,
		},
		State:      string(ev.State),
		ExitCode:   ev.ExitCode,
		Reason:     ev.Reason,
		Message:    ev.Message,
		StartedAt:  optionalTime(ev.StartedAt),
		FinishedAt: optionalTime(ev.FinishedAt),
		DetectedBy: string(ev.DetectedBy),
		ObservedAt: ev.ObservedAt.UTC(),
	}
}

func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// checkMatchesSDK encodes ev with e and with encodeWithSDK, and fails t
// unless both fail or both give the same subject, headers and body, byte
// for byte.
func checkMatchesSDK(t *testing.T, e *Encoder, ev generator.Event) {
	t.Helper()
	want, wantErr := encodeWithSDK(e, ev)
	got, gotErr := e.Encode(ev)
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%s Encode(%s) error = %v, the SDK's = %v", e.mode, describe(ev), gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	if got.Subject != want.Subject {
		t.Errorf("%s Encode(%s) subject = %q, the SDK's = %q", e.mode, describe(ev), got.Subject, want.Subject)
	}
	if diff := cmp.Diff(want.Header, got.Header); diff != "" {
		t.Errorf("%s Encode(%s) headers differ from the SDK's (-sdk +got):\n%s", e.mode, describe(ev), diff)
	}
	if bytes.Equal(got.Data, want.Data) {
		return
	}
	// The envelope's strings are escaped as encoding/json escapes them,
	// which json-iterator did not quite: where they need it, the bodies
	// differ in bytes, and must hold the same JSON (json.Unmarshal reads
	// the SDK's invalid UTF-8 as U+FFFD, as Encode writes it).
	if e.mode == ModeStructured && !plainEnvelope(e, ev) && utf8.Valid(got.Data) {
		var gotJSON, wantJSON any
		if err := json.Unmarshal(got.Data, &gotJSON); err != nil {
			t.Fatalf("%s Encode(%s) body is not JSON: %v", e.mode, describe(ev), err)
		}
		if err := json.Unmarshal(want.Data, &wantJSON); err != nil {
			t.Fatalf("the SDK's body of %s is not JSON: %v", describe(ev), err)
		}
		if diff := cmp.Diff(wantJSON, gotJSON); diff != "" {
			t.Errorf("%s Encode(%s) body holds other JSON than the SDK's (-sdk +got):\n%s", e.mode, describe(ev), diff)
		}
		return
	}
	t.Errorf("%s Encode(%s) body differs from the SDK's (-sdk +got):\n%s", e.mode, describe(ev), cmp.Diff(string(want.Data), string(got.Data)))
}

// plainEnvelope reports whether every string of ev's envelope is escaped
// alike by encoding/json and json-iterator: valid UTF-8 without '<', '>',
// '&', U+2028, U+2029, backspace or form feed.
func plainEnvelope(e *Encoder, ev generator.Event) bool {
	for _, s := range []string{ev.Pod.Namespace, ev.Pod.Name, ev.Container.Name, ev.Container.ID, ev.Pod.UID, e.node, e.source} {
		if !utf8.ValidString(s) || strings.ContainsAny(s, "<>&\u2028\u2029\b\f") {
			return false
		}
	}
	return true
}

// describe prints ev with its labels and annotations, which %+v hides
// behind a pointer.
func describe(ev generator.Event) string {
	s := fmt.Sprintf("%+v", ev)
	if m := ev.Pod.Meta; m != nil {
		s += fmt.Sprintf(" labels=%q (nil: %t) annotations=%q (nil: %t)", m.Labels, m.Labels == nil, m.Annotations, m.Annotations == nil)
	}
	return s
}

// bothModes returns a structured and a binary Encoder of node in cluster.
func bothModes(t testing.TB, node, cluster string) []*Encoder {
	t.Helper()
	var encs []*Encoder
	for _, mode := range []Mode{ModeStructured, ModeBinary} {
		e, err := NewEncoder(EncoderOptions{Node: node, ClusterName: cluster, SubjectPrefix: "pleg", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		encs = append(encs, e)
	}
	return encs
}

// sdkTestEvent is a ContainerDied event with every field set.
func sdkTestEvent() generator.Event {
	started := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	finished := time.Date(2026, 1, 2, 3, 9, 0, 500000000, time.UTC)
	return generator.Event{
		Type: generator.ContainerDied,
		Pod: generator.Pod{UID: "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", Namespace: "default", Name: "web-0",
			Meta: generator.NewPodMeta(
				map[string]string{"app.kubernetes.io/name": "web", "pod-template-hash": "5d8f7c9b4"},
				map[string]string{"example.com/team": "payments"},
			)},
		Container: generator.Container{ID: "3b9f0d2c5e7a41b8c6d9e0f1a2b3c4d5", Name: "app", Attempt: 1,
			Image: "registry.example/app:1.2", ImageRef: "registry.example/app@sha256:9c4e2b7a"},
		State: generator.StateExited, ExitCode: exitCodeOf(137), Reason: "OOMKilled", Message: "killed",
		StartedAt: started, FinishedAt: finished, Time: finished,
		DetectedBy: generator.SourceRelist, ObservedAt: finished.Add(110 * time.Millisecond),
	}
}

func exitCodeOf(c int32) *int32 { return &c }

func TestEncodeMatchesTheSDK(t *testing.T) {
	t.Parallel()
	const awkward = "<a href=\"x\">&amp;</a> \\ \b\f\n\r\t\x00\x1f\x7f \u2028\u2029 é 日本 😀 \ufffd \xff \xc3 \xed\xa0\x80 \xf4\x90\x80\x80"
	manyLabels := map[string]string{}
	for i := range 40 {
		manyLabels[fmt.Sprintf("label-%02d/%c", 39-i, 'z'-i%26)] = strings.Repeat("v", i)
	}
	year := func(y int) time.Time { return time.Date(y, 6, 7, 8, 9, 10, 11, time.UTC) }
	tests := []struct {
		name          string
		node, cluster string
		edit          func(*generator.Event)
	}{
		{name: "an event with every field set", node: "node-1"},
		{name: "a started event without exit code or finish time", node: "node-1", edit: func(ev *generator.Event) {
			ev.Type, ev.State, ev.ExitCode, ev.FinishedAt = generator.ContainerStarted, generator.StateRunning, nil, time.Time{}
			ev.Time = ev.StartedAt
		}},
		{name: "a removed event without runtime time takes the observed time", node: "node-1", edit: func(ev *generator.Event) {
			ev.Type, ev.State, ev.Time = generator.ContainerRemoved, generator.StateRemoved, time.Time{}
		}},
		{name: "a container found gone has no exit code and no times", node: "node-1", edit: func(ev *generator.Event) {
			ev.Type, ev.State, ev.ExitCode, ev.Reason, ev.Message = generator.ContainerRemoved, generator.StateUnknown, nil, "", ""
			ev.StartedAt, ev.FinishedAt, ev.Time = time.Time{}, time.Time{}, time.Time{}
		}},
		{name: "a zero exit code is written", node: "node-1", edit: func(ev *generator.Event) { ev.ExitCode = exitCodeOf(0) }},
		{name: "extreme exit codes and attempts are written in full", node: "node-1", edit: func(ev *generator.Event) {
			ev.ExitCode, ev.Container.Attempt = exitCodeOf(math.MinInt32), math.MaxUint32
		}},
		{name: "a sandbox has no container name in its subject", node: "node-1", edit: func(ev *generator.Event) {
			ev.Container.Sandbox, ev.Container.Name, ev.Container.Image, ev.Container.ImageRef = true, "", "", ""
		}},
		{name: "a pod whose sandbox was not seen has no labels", node: "node-1", edit: func(ev *generator.Event) { ev.Pod.Meta = nil }},
		{name: "a pod without labels has empty ones", node: "node-1", edit: func(ev *generator.Event) {
			ev.Pod.Meta = generator.NewPodMeta(nil, nil)
		}},
		{name: "a PodMeta with nil labels writes empty ones", node: "node-1", edit: func(ev *generator.Event) {
			ev.Pod.Meta = &generator.PodMeta{}
		}},
		{name: "empty annotations are written", node: "node-1", edit: func(ev *generator.Event) {
			ev.Pod.Meta = generator.NewPodMeta(map[string]string{"a": "b"}, map[string]string{})
		}},
		{name: "more labels than fit on the stack are sorted", node: "node-1", edit: func(ev *generator.Event) {
			ev.Pod.Meta = generator.NewPodMeta(manyLabels, manyLabels)
		}},
		{name: "a long annotation is written whole", node: "node-1", edit: func(ev *generator.Event) {
			ev.Pod.Meta = generator.NewPodMeta(nil, map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat(`{"spec":<&>}`, 8000)})
		}},
		{name: "awkward characters in every string", node: "node-1", edit: func(ev *generator.Event) {
			ev.Pod.UID, ev.Pod.Namespace, ev.Pod.Name = "uid"+awkward, "ns"+awkward, "pod"+awkward
			ev.Container.ID, ev.Container.Name = "id"+awkward, "ctr"+awkward
			ev.Container.Image, ev.Container.ImageRef = "img"+awkward, "ref"+awkward
			ev.Reason, ev.Message = awkward, awkward
			ev.State, ev.DetectedBy = generator.State(awkward), generator.Source(awkward)
			ev.Pod.Meta = generator.NewPodMeta(map[string]string{awkward: awkward, "<": ">", "&": ""}, map[string]string{awkward: "x"})
		}},
		{name: "awkward characters in the node and cluster names", node: "node " + awkward, cluster: "prod/" + awkward},
		{name: "keys that differ only after escaping sort by their raw bytes", node: "node-1", edit: func(ev *generator.Event) {
			ev.Pod.Meta = generator.NewPodMeta(map[string]string{"a<": "1", "a&": "2", "a\xff": "3", "a\u2028": "4", "a": "5", "A": "6"}, nil)
		}},
		{name: "empty names", node: "n", edit: func(ev *generator.Event) {
			ev.Pod.Namespace, ev.Pod.Name, ev.Container.Name = "", "", ""
		}},
		{name: "times in another zone are written in UTC", node: "node-1", edit: func(ev *generator.Event) {
			zone := time.FixedZone("x", -(9*3600 + 30*60 + 17))
			ev.StartedAt, ev.FinishedAt = ev.StartedAt.In(zone), ev.FinishedAt.In(zone)
			ev.Time, ev.ObservedAt = ev.Time.In(zone), ev.ObservedAt.In(zone)
		}},
		{name: "whole seconds and trailing zeros are trimmed", node: "node-1", edit: func(ev *generator.Event) {
			ev.StartedAt, ev.FinishedAt, ev.ObservedAt = year(2026).Truncate(time.Second), year(2026).Truncate(time.Millisecond), year(2026).Truncate(10*time.Microsecond)
		}},
		{name: "the years 0 and 9999 are written", node: "node-1", edit: func(ev *generator.Event) {
			ev.StartedAt, ev.FinishedAt, ev.Time, ev.ObservedAt = year(0), year(9999), year(0), year(9999)
		}},
		{name: "a data time after 9999 fails", node: "node-1", edit: func(ev *generator.Event) { ev.StartedAt = year(10000) }},
		{name: "a negative observed year fails", node: "node-1", edit: func(ev *generator.Event) { ev.ObservedAt = year(-1) }},
		{name: "an event time after 9999 is only in the envelope and is written", node: "node-1", edit: func(ev *generator.Event) {
			ev.Time, ev.FinishedAt = year(12345), time.Time{}
		}},
		{name: "an event without container ID fails", node: "node-1", edit: func(ev *generator.Event) { ev.Container.ID = "" }},
		{name: "an event without pod UID fails", node: "node-1", edit: func(ev *generator.Event) { ev.Pod.UID = "" }},
		{name: "an event without observed time fails", node: "node-1", edit: func(ev *generator.Event) { ev.ObservedAt = time.Time{} }},
		{name: "an event of an unknown type fails", node: "node-1", edit: func(ev *generator.Event) { ev.Type = "ContainerCreated" }},
	}
	for _, typ := range generator.LifecycleEventTypes {
		tests = append(tests, struct {
			name          string
			node, cluster string
			edit          func(*generator.Event)
		}{name: "a " + string(typ) + " event in a cluster", node: "node-1", cluster: "prod", edit: func(ev *generator.Event) { ev.Type = typ }})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := sdkTestEvent()
			if tc.edit != nil {
				tc.edit(&ev)
			}
			for _, e := range bothModes(t, tc.node, tc.cluster) {
				checkMatchesSDK(t, e, ev)
			}
		})
	}
	t.Run("random events", func(t *testing.T) {
		t.Parallel()
		r := rand.New(rand.NewPCG(7, 11))
		var encs [][]*Encoder
		for _, names := range [][2]string{{"node-1", ""}, {"node-1", "prod"}, {"ip-10-0-0-1.ec2.internal", "eu west"}, {randomString(r) + "n", randomString(r)}} {
			encs = append(encs, bothModes(t, names[0], names[1]))
		}
		for range 3000 {
			ev := randomEvent(r)
			for _, e := range encs[r.IntN(len(encs))] {
				checkMatchesSDK(t, e, ev)
			}
			if t.Failed() {
				return
			}
		}
	})
}

// pieces are what randomString makes its strings of: what JSON escapes in
// either layer, and what it must leave alone.
var pieces = []string{
	"a", "web-0", "app.kubernetes.io/name", " ", "é", "日本", "😀", "\ufffd",
	"<", ">", "&", `"`, `\`, "/", "'", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f",
	"\u2028", "\u2029", "\u0080", "\ufeff",
	"\xff", "\xc3", "\xe2\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf",
}

// randomString returns a string of up to 8 pieces, now and then a long one.
func randomString(r *rand.Rand) string {
	var b strings.Builder
	n := r.IntN(9)
	if r.IntN(50) == 0 {
		n = 2000
	}
	for range n {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

// randomMap returns nil, an empty map or one of up to 20 random entries.
func randomMap(r *rand.Rand) map[string]string {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return map[string]string{}
	}
	m := map[string]string{}
	for range r.IntN(21) {
		m[randomString(r)] = randomString(r)
	}
	return m
}

// randomTime returns the zero time now and then, else a time between the
// years 0 and 9999 in a random zone, and rarely one just outside them.
func randomTime(r *rand.Rand) time.Time {
	switch r.IntN(20) {
	case 0:
		return time.Time{}
	case 1:
		return time.Date(10000+r.IntN(3), 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Duration(r.IntN(2)))
	}
	t := time.Date(r.IntN(10000), time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), 0, time.UTC)
	switch r.IntN(3) {
	case 0:
		t = t.Add(time.Duration(r.IntN(1e9)))
	case 1:
		t = t.Add(time.Duration(r.IntN(1000)) * time.Millisecond)
	}
	return t.In(time.FixedZone("", (r.IntN(48)-24)*1800))
}

// randomEvent returns an event with every field drawn at random, valid or
// not.
func randomEvent(r *rand.Rand) generator.Event {
	ev := generator.Event{
		Type: generator.LifecycleEventTypes[r.IntN(len(generator.LifecycleEventTypes))],
		Pod:  generator.Pod{UID: "uid-" + randomString(r), Namespace: randomString(r), Name: randomString(r)},
		Container: generator.Container{ID: "id-" + randomString(r), Name: randomString(r), Attempt: r.Uint32() >> r.IntN(33),
			Sandbox: r.IntN(4) == 0, Image: randomString(r), ImageRef: randomString(r)},
		State:      []generator.State{generator.StateRunning, generator.StateExited, generator.StateUnknown, generator.StateRemoved}[r.IntN(4)],
		Reason:     randomString(r),
		Message:    randomString(r),
		StartedAt:  randomTime(r),
		FinishedAt: randomTime(r),
		Time:       randomTime(r),
		DetectedBy: []generator.Source{generator.SourceRelist, generator.SourceEvented}[r.IntN(2)],
		ObservedAt: randomTime(r),
	}
	if r.IntN(3) > 0 {
		ev.ExitCode = exitCodeOf(int32(r.Uint32()) >> r.IntN(32))
	}
	switch r.IntN(4) {
	case 0: // no sandbox seen
	case 1:
		ev.Pod.Meta = &generator.PodMeta{Annotations: randomMap(r)}
	default:
		ev.Pod.Meta = generator.NewPodMeta(randomMap(r), randomMap(r))
	}
	return ev
}

// FuzzEncodeMatchesTheSDK holds Encode to encodeWithSDK for whatever the
// fuzzer makes of names, free text, one label and one annotation, exit
// codes and times. Times are nanoseconds since 1970, 0 meaning none,
// shifted by years.
func FuzzEncodeMatchesTheSDK(f *testing.F) {
	const (
		started  = int64(1767323045123456789)
		finished = int64(1767323340500000000)
		observed = int64(1767323340610000000)
	)
	f.Add("node-1", "", "default", "web-0", "app", "registry.example/app:1.2", "OOMKilled", "", "app", "web",
		uint8(1), false, int32(137), true, started, finished, observed, int16(0), uint8(2))
	f.Add("node-1", "prod", "default", "web-0", "", "", "", "", "", "",
		uint8(0), true, int32(0), false, started, int64(0), observed, int16(0), uint8(0))
	f.Add("node one/ü", "east west", "ns<>&", "pod\u2028\u2029", "ctr\xff\xc3", "img\"\\", "\b\f\n\r\t\x00\x7f", "<script>&</script>", "k\xed\xa0\x80", "v😀",
		uint8(2), false, int32(-1), true, int64(0), int64(0), observed, int16(-1970), uint8(3))
	f.Add("n", "", "", "", "", "", "", strings.Repeat("long message ", 500), "a<", "b>",
		uint8(1), false, int32(math.MaxInt32), true, started, finished, observed, int16(8000), uint8(1))
	f.Fuzz(func(t *testing.T, node, cluster, namespace, pod, container, image, reason, message, key, value string,
		typ uint8, sandbox bool, exit int32, hasExit bool, startedAt, finishedAt, observedAt int64, years int16, meta uint8) {
		encs := make([]*Encoder, 0, 2)
		for _, mode := range []Mode{ModeStructured, ModeBinary} {
			e, err := NewEncoder(EncoderOptions{Node: node, ClusterName: cluster, SubjectPrefix: "pleg", Mode: mode})
			if err != nil {
				t.Skip(err)
			}
			encs = append(encs, e)
		}
		at := func(ns int64) time.Time {
			if ns == 0 {
				return time.Time{}
			}
			return time.Unix(0, ns).AddDate(int(years), 0, 0)
		}
		ev := generator.Event{
			Type:       generator.LifecycleEventTypes[int(typ)%len(generator.LifecycleEventTypes)],
			Pod:        generator.Pod{UID: "uid-" + value, Namespace: namespace, Name: pod},
			Container:  generator.Container{ID: "id-" + key, Name: container, Sandbox: sandbox, Image: image, ImageRef: image},
			State:      generator.StateExited,
			Reason:     reason,
			Message:    message,
			StartedAt:  at(startedAt),
			FinishedAt: at(finishedAt),
			Time:       at(finishedAt),
			DetectedBy: generator.SourceRelist,
			ObservedAt: at(observedAt),
		}
		if hasExit {
			ev.ExitCode = &exit
		}
		switch meta % 4 {
		case 1:
			ev.Pod.Meta = generator.NewPodMeta(map[string]string{key: value}, nil)
		case 2:
			ev.Pod.Meta = generator.NewPodMeta(map[string]string{key: value, value: key}, map[string]string{key: message})
		case 3:
			ev.Pod.Meta = &generator.PodMeta{Annotations: map[string]string{}}
		}
		for _, e := range encs {
			checkMatchesSDK(t, e, ev)
		}
	})
}
