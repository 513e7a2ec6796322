package publish

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// viaSetters builds the CloudEvent of ev the plain way, through the SDK's
// setters, SetData and Validate: the reference Encoder.cloudEvent must
// match.
func viaSetters(t *testing.T, e *Encoder, cluster string, ev generator.Event) event.Event {
	t.Helper()
	when := ev.Time
	if when.IsZero() {
		when = ev.ObservedAt
	}
	ce := event.New(event.CloudEventsVersionV1)
	ce.SetID(uuid.NewSHA1(eventIDNamespace, []byte(ev.Container.ID+"/"+string(ev.Type))).String())
	ce.SetSource(Source(cluster, e.node))
	ce.SetType(CloudEventType(ev.Type))
	ce.SetSubject(ceSubject(ev))
	ce.SetTime(when.UTC())
	ce.SetDataSchema(e.types[ev.Type].dataSchemaRef.String())
	ce.SetExtension("poduid", ev.Pod.UID)
	ce.SetExtension("node", e.node)
	ce.SetExtension("containerid", ev.Container.ID)
	data := e.data(ev)
	if err := ce.SetData(contentTypeJSON, &data); err != nil {
		t.Fatalf("SetData: %v", err)
	}
	if err := ce.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return ce
}

func TestEncodeMatchesTheSDKSetters(t *testing.T) {
	t.Parallel()
	exit := int32(137)
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	base := generator.Event{
		Pod: generator.Pod{UID: "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", Namespace: "default", Name: "web-0"},
		Container: generator.Container{ID: "3b9f0d2c5e7a41b8", Name: "app", Attempt: 2,
			Image: "registry.example/app:1.2", ImageRef: "registry.example/app@sha256:9c4e"},
		State: generator.StateExited, ExitCode: &exit, Reason: "OOMKilled", Message: "line 1\nline \"2\"",
		StartedAt: at, FinishedAt: at.Add(time.Minute), DetectedBy: generator.SourceEvented,
		Time: at.Add(time.Minute), ObservedAt: at.Add(time.Minute + time.Millisecond),
	}
	for _, tc := range []struct {
		name, node, cluster string
		edit                func(*generator.Event)
	}{
		{name: "died", node: "node-1"},
		{name: "started, no exit", node: "node-1", edit: func(ev *generator.Event) {
			ev.Type, ev.State, ev.ExitCode, ev.FinishedAt = generator.ContainerStarted, generator.StateRunning, nil, time.Time{}
		}},
		{name: "removed, no event time", node: "node-1", edit: func(ev *generator.Event) {
			ev.Type, ev.Time = generator.ContainerRemoved, time.Time{}
		}},
		{name: "sandbox", node: "node-1", edit: func(ev *generator.Event) { ev.Container.Sandbox = true }},
		{name: "cluster and names to escape", node: "node one/ü", cluster: "prod east", edit: func(ev *generator.Event) {
			ev.Pod.Name, ev.Container.Name = "web 0", "ü/app"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := NewEncoder(EncoderOptions{Node: tc.node, ClusterName: tc.cluster, SubjectPrefix: "pleg"})
			if err != nil {
				t.Fatal(err)
			}
			ev := base
			ev.Type = generator.ContainerDied
			if tc.edit != nil {
				tc.edit(&ev)
			}
			info, err := e.check(ev)
			if err != nil {
				t.Fatalf("check: %v", err)
			}
			got := e.cloudEvent(ev, info, EventID(ev.Container.ID, ev.Type))
			if got.DataEncoded, err = e.appendData(nil, ev); err != nil {
				t.Fatalf("appendData: %v", err)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			want := viaSetters(t, e, tc.cluster, ev)
			gotJSON, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			wantJSON, err := json.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(wantJSON), string(gotJSON)); diff != "" {
				t.Errorf("structured CloudEvent differs from the setters' (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(binaryHeaders(&want), binaryHeaders(&got)); diff != "" {
				t.Errorf("binary headers differ from the setters' (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEventIDIsUUIDv5(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 1000 {
		id := fmt.Sprintf("%x", r.Uint64())
		if i%10 == 0 {
			id = fmt.Sprintf("%0200d", i) // longer than EventID's stack buffer
		}
		typ := generator.LifecycleEventTypes[i%len(generator.LifecycleEventTypes)]
		want := uuid.NewSHA1(eventIDNamespace, []byte(id+"/"+string(typ))).String()
		if got := EventID(id, typ); got != want {
			t.Fatalf("EventID(%q, %s) = %s, want uuid.NewSHA1's %s", id, typ, got, want)
		}
	}
}
