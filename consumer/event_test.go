package consumer_test

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

const subject = "pleg.node-1.6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70.ContainerDied"

func TestDecode(t *testing.T) {
	t.Parallel()
	f := died()
	want := f.event(t, subject)
	odd := died()
	odd.podUID, odd.node, odd.pod = `odd "uid" 100% é`, "node 1", "wéb-0"

	tests := []struct {
		name  string
		build func(t *testing.T) (nats.Header, []byte)
		want  consumer.Event
	}{
		{
			name:  "a structured event decodes with all its attributes",
			build: func(t *testing.T) (nats.Header, []byte) { return f.structured(t) },
			want:  want,
		},
		{
			name:  "a binary event decodes with all its attributes",
			build: func(t *testing.T) (nats.Header, []byte) { return f.binary(t) },
			want:  want,
		},
		{
			name: "binary headers match whatever their case",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.binary(t)
				upper := nats.Header{}
				for k, v := range h {
					upper["Ce-"+strings.TrimPrefix(k, "ce-")] = v
				}
				return upper, body
			},
			want: want,
		},
		{
			name: "a structured content type with parameters is still structured",
			build: func(t *testing.T) (nats.Header, []byte) {
				_, body := f.structured(t)
				return nats.Header{"Content-Type": {"application/cloudevents+json; charset=utf-8"}}, body
			},
			want: want,
		},
		{
			name: "structured data_base64 is decoded",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.structured(t)
				var m map[string]any
				mustUnmarshal(t, body, &m)
				delete(m, "data")
				m["data_base64"] = base64.StdEncoding.EncodeToString(f.dataJSON(t))
				return h, mustMarshal(t, m)
			},
			want: want,
		},
		{
			name: "a binary event from a bridge that put datacontenttype in Content-Type still decodes",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.binary(t)
				delete(h, "ce-datacontenttype")
				h.Set("Content-Type", "application/json")
				return h, body
			},
			want: want,
		},
		{
			name: "a binary event with neither ce-datacontenttype nor Content-Type is taken as JSON",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.binary(t)
				delete(h, "ce-datacontenttype")
				return h, body
			},
			want: want,
		},
		{
			name: "the bare application/cloudevents content type of the NATS binding is structured",
			build: func(t *testing.T) (nats.Header, []byte) {
				_, body := f.structured(t)
				return nats.Header{"Content-Type": {"application/cloudevents"}}, body
			},
			want: want,
		},
		{
			name: "binary header values in double quotes, as older binding versions allow, are unquoted",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.binary(t)
				h.Set("ce-subject", `"default/web-0/app"`)
				h.Set("ce-source", `"/nodes/node\-1"`)
				return h, body
			},
			want: want,
		},
		{
			name: "needlessly percent-encoded and lower-case escapes are accepted",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.binary(t)
				h.Set("ce-subject", "default%2fweb%2D0/app")
				return h, body
			},
			want: want,
		},
		{
			name:  "binary header values are percent-decoded",
			build: func(t *testing.T) (nats.Header, []byte) { return odd.binary(t) },
			want:  odd.event(t, subject),
		},
		{
			name: "missing extensions are taken from the data",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.binary(t)
				delete(h, "ce-poduid")
				delete(h, "ce-node")
				delete(h, "ce-containerid")
				return h, body
			},
			want: want,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, body := tt.build(t)
			got, err := consumer.Decode(subject, h, body)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decode mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecodeAcceptsTheDataschemaOfEveryContract: a stream holds events of
// bridges from before contract versions, whose dataschema has no contract
// segment, beside this contract's; both decode, in both modes, and the
// dataschema says which contract wrote each.
func TestDecodeAcceptsTheDataschemaOfEveryContract(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		dataschema string
		contract   string
	}{
		{"this contract's", "https://pleg-bridge.dev/schemas/contract/" + schemas.ContractVersion + "/v1/ContainerDied.json", schemas.ContractVersion},
		{"a bridge's from before contract versions", "https://pleg-bridge.dev/schemas/v1/ContainerDied.json", ""},
	} {
		for mode, build := range map[string]func(fixture, testing.TB) (nats.Header, []byte){
			"structured": fixture.structured, "binary": fixture.binary,
		} {
			t.Run(tt.name+" in "+mode+" mode", func(t *testing.T) {
				t.Parallel()
				f := died()
				f.legacy = tt.contract == ""
				if got := f.dataSchema(); got != tt.dataschema {
					t.Fatalf("the fixture's dataschema is %q, want %q", got, tt.dataschema)
				}
				h, body := build(f, t)
				e, err := consumer.Decode(subject, h, body)
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				ceType, contract, ok := schemas.ParseDataSchema(e.DataSchema)
				if e.DataSchema != tt.dataschema || ceType != e.Type || contract != tt.contract || !ok {
					t.Errorf("DataSchema %q reads as %q, contract %q, %v; want %q, %q, contract %q",
						e.DataSchema, ceType, contract, ok, tt.dataschema, e.Type, tt.contract)
				}
			})
		}
	}
}

func TestDecodeKeepsNanosecondsAndLifecycleType(t *testing.T) {
	t.Parallel()
	h, body := died().structured(t)
	e, err := consumer.Decode(subject, h, body)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if got := e.Time.Nanosecond(); got != 123456789 {
		t.Errorf("Time.Nanosecond() = %d, want 123456789", got)
	}
	if got := e.LifecycleType(); got != "ContainerDied" {
		t.Errorf("LifecycleType() = %q, want ContainerDied", got)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	f := died()
	// structuredWith returns the structured event with attributes replaced;
	// a nil value removes the attribute.
	structuredWith := func(attrs map[string]any) func(t *testing.T) (nats.Header, []byte) {
		return func(t *testing.T) (nats.Header, []byte) {
			h, body := f.structured(t)
			var m map[string]any
			mustUnmarshal(t, body, &m)
			for k, v := range attrs {
				if v == nil {
					delete(m, k)
				} else {
					m[k] = v
				}
			}
			return h, mustMarshal(t, m)
		}
	}
	binaryWith := func(k, v string) func(t *testing.T) (nats.Header, []byte) {
		return func(t *testing.T) (nats.Header, []byte) {
			h, body := f.binary(t)
			if v == "" {
				delete(h, k)
			} else {
				h.Set(k, v)
			}
			return h, body
		}
	}
	raw := func(h nats.Header, body string) func(t *testing.T) (nats.Header, []byte) {
		return func(*testing.T) (nats.Header, []byte) { return h, []byte(body) }
	}
	tests := []struct {
		name    string
		build   func(t *testing.T) (nats.Header, []byte)
		wantErr string
	}{
		{
			name:    "a message with neither content mode is not a CloudEvent",
			build:   raw(nil, `{"hello":"world"}`),
			wantErr: "not a CloudEvent",
		},
		{
			name:    "another content type without ce- headers is named",
			build:   raw(nats.Header{"Content-Type": {"text/plain"}}, "hi"),
			wantErr: `content type "text/plain"`,
		},
		{
			name:    "a structured body that is not JSON is refused",
			build:   raw(nats.Header{"Content-Type": {"application/cloudevents+json"}}, "{"),
			wantErr: "parse structured CloudEvent JSON",
		},
		{
			name:    "specversion 0.3 is not 1.0",
			build:   structuredWith(map[string]any{"specversion": "0.3"}),
			wantErr: `specversion "0.3" is not 1.0`,
		},
		{
			name:    "a missing specversion is named",
			build:   structuredWith(map[string]any{"specversion": nil}),
			wantErr: "missing specversion",
		},
		{
			name:    "a type from elsewhere is not a pleg-bridge type",
			build:   structuredWith(map[string]any{"type": "io.k8s.pod.Created"}),
			wantErr: `type "io.k8s.pod.Created" is not a pleg-bridge type`,
		},
		{
			name:    "a future version of a pleg type is not accepted",
			build:   structuredWith(map[string]any{"type": "pleg.v2.ContainerDied"}),
			wantErr: `type "pleg.v2.ContainerDied" is not a pleg-bridge type`,
		},
		{
			name:    "a time that is not RFC 3339 is named",
			build:   structuredWith(map[string]any{"time": "yesterday"}),
			wantErr: `time "yesterday" is not an RFC 3339 time`,
		},
		{
			name:    "a missing time is named",
			build:   structuredWith(map[string]any{"time": nil}),
			wantErr: "missing time",
		},
		{
			name:    "a missing id is named",
			build:   structuredWith(map[string]any{"id": nil}),
			wantErr: "missing id",
		},
		{
			name:    "a missing source is named",
			build:   structuredWith(map[string]any{"source": nil}),
			wantErr: "missing source",
		},
		{
			name:    "missing data is named",
			build:   structuredWith(map[string]any{"data": nil}),
			wantErr: "missing data",
		},
		{
			name:    "data that is not the event data object is refused",
			build:   structuredWith(map[string]any{"data": "oops"}),
			wantErr: "parse data",
		},
		{
			name:    "a binary event without type is named",
			build:   binaryWith("ce-type", ""),
			wantErr: "missing type",
		},
		{
			name:    "a binary header that is not percent-encoded right is named",
			build:   binaryWith("ce-subject", "default%zz"),
			wantErr: "header ce-subject",
		},
		{
			name:    "a binary event whose data is not JSON is named",
			build:   binaryWith("ce-datacontenttype", "text/plain"),
			wantErr: `datacontenttype "text/plain" is not application/json`,
		},
		{
			name: "an old binary event whose Content-Type is not JSON is named",
			build: func(t *testing.T) (nats.Header, []byte) {
				h, body := f.binary(t)
				delete(h, "ce-datacontenttype")
				h.Set("Content-Type", "text/plain")
				return h, body
			},
			wantErr: `datacontenttype "text/plain" is not application/json`,
		},
		{
			name:    "a percent-encoded header value that is not UTF-8 is refused",
			build:   binaryWith("ce-subject", "default%C0%A0web"),
			wantErr: "header ce-subject",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, body := tt.build(t)
			_, err := consumer.Decode(subject, h, body)
			if err == nil {
				t.Fatalf("Decode succeeded, want error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Decode error = %q, want it to contain %q", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), subject) {
				t.Errorf("Decode error = %q, want it to name the subject %s", err, subject)
			}
		})
	}
}

func TestCloudEventJSONDecodesToTheSameEvent(t *testing.T) {
	t.Parallel()
	h, body := died().binary(t)
	e, err := consumer.Decode(subject, h, body)
	if err != nil {
		t.Fatalf("Decode binary: %v", err)
	}
	b, err := e.CloudEventJSON()
	if err != nil {
		t.Fatalf("CloudEventJSON: %v", err)
	}
	if strings.Contains(string(b), "\n") {
		t.Errorf("CloudEventJSON is not one line: %s", b)
	}
	again, err := consumer.Decode(subject, nats.Header{"Content-Type": {"application/cloudevents+json"}}, b)
	if err != nil {
		t.Fatalf("Decode CloudEventJSON output: %v", err)
	}
	if diff := cmp.Diff(e, again); diff != "" {
		t.Errorf("round trip mismatch (-binary +structured):\n%s", diff)
	}
}

func TestDecodesTheSchemaExamples(t *testing.T) {
	t.Parallel()
	for _, typ := range schemas.Types() {
		t.Run(typ, func(t *testing.T) {
			t.Parallel()
			body, ok := schemas.Example(typ)
			if !ok {
				t.Fatalf("no example for %s", typ)
			}
			e, err := consumer.Decode("pleg.x.y.z", nats.Header{"Content-Type": {"application/cloudevents+json"}}, body)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if e.Type != typ || e.Time.IsZero() || e.PodUID == "" || e.Data.Pod.UID != e.PodUID {
				t.Errorf("Decode(example %s) = %+v, want its type, time and pod UID", typ, e)
			}
		})
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
}

// TestDecodesWhatPublishEncodes checks the decoder against the bridge's own
// encoder in both content modes, with names that need escaping.
func TestDecodesWhatPublishEncodes(t *testing.T) {
	t.Parallel()
	code := int32(137)
	at := time.Date(2026, 1, 2, 3, 9, 0, 500000001, time.UTC)
	ev := generator.Event{
		Type: generator.ContainerDied,
		Pod: generator.Pod{UID: "uid with space%", Namespace: "default", Name: "wéb-0",
			Meta: generator.NewPodMeta(map[string]string{"app": "web"}, map[string]string{"team": "payments"})},
		Container:  generator.Container{ID: "3b9f", Name: "app", Image: "registry.example/app:1.2"},
		State:      generator.StateExited,
		ExitCode:   &code,
		Reason:     "OOMKilled",
		StartedAt:  at.Add(-time.Minute),
		FinishedAt: at,
		Time:       at,
		DetectedBy: generator.SourceRelist,
		ObservedAt: at.Add(time.Second),
	}
	for _, mode := range []publish.Mode{publish.ModeStructured, publish.ModeBinary} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1.example.com", SubjectPrefix: "pleg", Mode: mode})
			if err != nil {
				t.Fatalf("NewEncoder: %v", err)
			}
			msg, err := enc.Encode(ev)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := consumer.Decode(msg.Subject, msg.Header, msg.Data)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			startedAt, finishedAt := ev.StartedAt, ev.FinishedAt
			want := consumer.Event{
				ID:          publish.EventID("3b9f", generator.ContainerDied),
				Source:      "/nodes/node-1.example.com",
				Type:        schemas.TypeContainerDied,
				Subject:     "default/wéb-0/app",
				Time:        at,
				DataSchema:  "https://pleg-bridge.dev/schemas/contract/2/v1/ContainerDied.json",
				PodUID:      "uid with space%",
				Node:        "node-1.example.com",
				ContainerID: "3b9f",
				Data: schemas.EventData{
					Node: "node-1.example.com",
					Pod: schemas.Pod{UID: "uid with space%", Namespace: "default", Name: "wéb-0",
						Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"team": "payments"}},
					Container:  schemas.Container{ID: "3b9f", Name: "app", Image: "registry.example/app:1.2"},
					State:      "exited",
					ExitCode:   &code,
					Reason:     "OOMKilled",
					StartedAt:  &startedAt,
					FinishedAt: &finishedAt,
					DetectedBy: "relist",
					ObservedAt: at.Add(time.Second),
				},
				NATSSubject: "pleg.node-1_example_com.default.uid%20with%20space%25.ContainerDied",
			}
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(consumer.Event{}, "RawData")); diff != "" {
				t.Errorf("Decode(Encode(event)) mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
