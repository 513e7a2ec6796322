package publish_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const (
	testPodUID      = "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70"
	testContainerID = "3b9f0d2c5e7a41b8c6d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5"
)

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func exitCode(c int32) *int32 { return &c }

// goldenEvents is one event of each Lifecycle type of the same container.
func goldenEvents(t testing.TB) map[generator.LifecycleEventType]generator.Event {
	t.Helper()
	pod := generator.Pod{UID: testPodUID, Namespace: "default", Name: "web-0", Meta: generator.NewPodMeta(
		map[string]string{"app.kubernetes.io/name": "web", "pod-template-hash": "5d8f7c9b4"},
		map[string]string{"example.com/team": "payments"},
	)}
	ctr := generator.Container{
		ID: testContainerID, Name: "app", Attempt: 0,
		Image:    "registry.example/app:1.2",
		ImageRef: "registry.example/app@sha256:9c4e2b7a1d0f8e3c6b5a4d2f1e0c9b8a7d6e5f4c3b2a1908f7e6d5c4b3a29180",
	}
	started := mustTime(t, "2026-01-02T03:04:05.123456789Z")
	finished := mustTime(t, "2026-01-02T03:09:00.5Z")
	return map[generator.LifecycleEventType]generator.Event{
		generator.ContainerStarted: {
			Type: generator.ContainerStarted, Pod: pod, Container: ctr,
			State: generator.StateRunning, StartedAt: started, Time: started,
			DetectedBy: generator.SourceEvented, ObservedAt: mustTime(t, "2026-01-02T03:04:05.2Z"),
		},
		generator.ContainerDied: {
			Type: generator.ContainerDied, Pod: pod, Container: ctr,
			State: generator.StateExited, ExitCode: exitCode(137), Reason: "OOMKilled",
			StartedAt: started, FinishedAt: finished, Time: finished,
			DetectedBy: generator.SourceRelist, ObservedAt: mustTime(t, "2026-01-02T03:09:00.61Z"),
		},
		generator.ContainerRemoved: {
			Type: generator.ContainerRemoved, Pod: pod, Container: ctr,
			State: generator.StateRemoved, ExitCode: exitCode(137), Reason: "OOMKilled",
			StartedAt: started, FinishedAt: finished,
			DetectedBy: generator.SourceRelist, ObservedAt: mustTime(t, "2026-01-02T03:09:31.008Z"),
		},
	}
}

func newEncoder(t testing.TB, opts publish.EncoderOptions) *publish.Encoder {
	t.Helper()
	if opts.Node == "" {
		opts.Node = "node-1"
	}
	if opts.SubjectPrefix == "" {
		opts.SubjectPrefix = "pleg"
	}
	enc, err := publish.NewEncoder(opts)
	if err != nil {
		t.Fatalf("NewEncoder(%+v): %v", opts, err)
	}
	return enc
}

func encode(t testing.TB, enc *publish.Encoder, ev generator.Event) *nats.Msg {
	t.Helper()
	msg, err := enc.Encode(ev)
	if err != nil {
		t.Fatalf("Encode(%+v): %v", ev, err)
	}
	return msg
}

// goldenPath is the golden file of a structured-mode message: the
// CloudEvent JSON, indented.
func goldenPath(t generator.LifecycleEventType) string {
	return filepath.Join("testdata", string(t)+".golden.json")
}

// binaryGoldenPath is the golden file of a binary-mode message: its headers,
// one "name: value" line each in name order, a blank line, and the body
// (the data) indented.
func binaryGoldenPath(t generator.LifecycleEventType) string {
	return filepath.Join("testdata", string(t)+".binary.golden")
}

// checkGolden compares got with the golden file at path, or rewrites the
// file with -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test ./publish -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("encoded message differs from %s (-want +got):\n%s", path, diff)
	}
}

func indentJSON(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		t.Fatalf("indent encoded JSON: %v\n%s", err, b)
	}
	out.WriteByte('\n')
	return out.Bytes()
}

func TestEncodeMatchesGoldenFiles(t *testing.T) {
	enc := newEncoder(t, publish.EncoderOptions{})
	binary := newEncoder(t, publish.EncoderOptions{Mode: publish.ModeBinary})
	events := goldenEvents(t)
	for _, typ := range generator.LifecycleEventTypes {
		t.Run(string(typ)+"/structured", func(t *testing.T) {
			msg := encode(t, enc, events[typ])
			checkGolden(t, goldenPath(typ), indentJSON(t, msg.Data))
		})
		t.Run(string(typ)+"/binary", func(t *testing.T) {
			msg := encode(t, binary, events[typ])
			var got bytes.Buffer
			for _, name := range slices.Sorted(maps.Keys(msg.Header)) {
				for _, v := range msg.Header[name] {
					fmt.Fprintf(&got, "%s: %s\n", name, v)
				}
			}
			got.WriteByte('\n')
			got.Write(indentJSON(t, msg.Data))
			checkGolden(t, binaryGoldenPath(typ), got.Bytes())
		})
	}
}

func TestGoldenFilesAreValidCloudEvents(t *testing.T) {
	for _, typ := range generator.LifecycleEventTypes {
		t.Run(string(typ), func(t *testing.T) {
			data, err := os.ReadFile(goldenPath(typ))
			if err != nil {
				t.Fatal(err)
			}
			schemastest.ValidateCloudEvent(t, data)
		})
	}
}

// TestBinaryGoldenFilesCarryTheStructuredEvent reads each binary golden file
// as a receiver following the NATS binding would (every ce- header is an
// attribute, the body is the data) and finds the same CloudEvent as the
// structured golden file: no attribute lost or added between the modes.
func TestBinaryGoldenFilesCarryTheStructuredEvent(t *testing.T) {
	for _, typ := range generator.LifecycleEventTypes {
		t.Run(string(typ), func(t *testing.T) {
			b, err := os.ReadFile(binaryGoldenPath(typ))
			if err != nil {
				t.Fatal(err)
			}
			head, body, ok := strings.Cut(string(b), "\n\n")
			if !ok {
				t.Fatalf("%s has no blank line between headers and body", binaryGoldenPath(typ))
			}
			fromBinary := map[string]any{}
			for line := range strings.Lines(head) {
				name, value, _ := strings.Cut(strings.TrimSuffix(line, "\n"), ": ")
				if attr, ok := strings.CutPrefix(name, "ce-"); ok {
					fromBinary[attr] = value
				} else if name != "Nats-Msg-Id" {
					t.Errorf("binary header %q is neither a ce- attribute nor Nats-Msg-Id", name)
				}
			}
			schemastest.Validate(t, publish.CloudEventType(typ), []byte(body))
			var data any
			if err := json.Unmarshal([]byte(body), &data); err != nil {
				t.Fatalf("binary body: %v", err)
			}
			fromBinary["data"] = data

			structuredJSON, err := os.ReadFile(goldenPath(typ))
			if err != nil {
				t.Fatal(err)
			}
			var fromStructured map[string]any
			if err := json.Unmarshal(structuredJSON, &fromStructured); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(fromStructured, fromBinary); diff != "" {
				t.Errorf("binary golden file differs from the structured one (-structured +binary):\n%s", diff)
			}
		})
	}
}

// structured is the decoded body of a structured-mode message.
type structured struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	DataSchema      string          `json:"dataschema"`
	PodUID          string          `json:"poduid"`
	Node            string          `json:"node"`
	ContainerID     string          `json:"containerid"`
	Data            json.RawMessage `json:"data"`
	data            map[string]any
}

func decodeStructured(t testing.TB, body []byte) structured {
	t.Helper()
	var s structured
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("decode structured event: %v\n%s", err, body)
	}
	if err := json.Unmarshal(s.Data, &s.data); err != nil {
		t.Fatalf("decode data: %v\n%s", err, s.Data)
	}
	return s
}

func TestEncode(t *testing.T) {
	base := goldenEvents(t)
	tests := []struct {
		name   string
		opts   publish.EncoderOptions
		event  func(ev *generator.Event)
		evType generator.LifecycleEventType
		check  func(t *testing.T, msg *nats.Msg, ce structured)
	}{
		{
			name:   "a container's subject names namespace, pod and container",
			evType: generator.ContainerStarted,
			check: func(t *testing.T, msg *nats.Msg, ce structured) {
				if ce.Subject != "default/web-0/app" {
					t.Errorf("subject = %q, want default/web-0/app", ce.Subject)
				}
				want := "pleg.node-1.default." + testPodUID + ".ContainerStarted"
				if msg.Subject != want {
					t.Errorf("NATS subject = %q, want %q", msg.Subject, want)
				}
			},
		},
		{
			name:   "a sandbox's subject names only namespace and pod and its data says sandbox",
			evType: generator.ContainerDied,
			event: func(ev *generator.Event) {
				ev.Container = generator.Container{ID: "sandbox-1", Sandbox: true}
				ev.ExitCode = nil
				ev.Reason = ""
			},
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				if ce.Subject != "default/web-0" {
					t.Errorf("subject = %q, want default/web-0", ce.Subject)
				}
				ctr := ce.data["container"].(map[string]any)
				if ctr["sandbox"] != true {
					t.Errorf("data container.sandbox = %v, want true", ctr["sandbox"])
				}
			},
		},
		{
			name:   "a container's data writes sandbox false",
			evType: generator.ContainerStarted,
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				ctr := ce.data["container"].(map[string]any)
				if v, ok := ctr["sandbox"]; !ok || v != false {
					t.Errorf("data container.sandbox = %v (present %v), want false", v, ok)
				}
			},
		},
		{
			name:   "a cluster name puts the node under the cluster in the source",
			opts:   publish.EncoderOptions{ClusterName: "prod-eu"},
			evType: generator.ContainerStarted,
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				if ce.Source != "/clusters/prod-eu/nodes/node-1" {
					t.Errorf("source = %q, want /clusters/prod-eu/nodes/node-1", ce.Source)
				}
			},
		},
		{
			name:   "names that are not path segments are escaped in the source and raw in the node extension",
			opts:   publish.EncoderOptions{ClusterName: "a/b c", Node: "n?1"},
			evType: generator.ContainerStarted,
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				if ce.Source != "/clusters/a%2Fb%20c/nodes/n%3F1" {
					t.Errorf("source = %q, want /clusters/a%%2Fb%%20c/nodes/n%%3F1", ce.Source)
				}
				if ce.Node != "n?1" || ce.data["node"] != "n?1" {
					t.Errorf("node extension %q, data node %v, want n?1 for both", ce.Node, ce.data["node"])
				}
			},
		},
		{
			name:   "the pod's labels and allowlisted annotations are in the data",
			evType: generator.ContainerStarted,
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				pod := ce.data["pod"].(map[string]any)
				want := map[string]any{"app.kubernetes.io/name": "web", "pod-template-hash": "5d8f7c9b4"}
				if diff := cmp.Diff(want, pod["labels"]); diff != "" {
					t.Errorf("data pod.labels (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(map[string]any{"example.com/team": "payments"}, pod["annotations"]); diff != "" {
					t.Errorf("data pod.annotations (-want +got):\n%s", diff)
				}
			},
		},
		{
			name:   "labels are left out when no sandbox of the pod was seen",
			evType: generator.ContainerDied,
			event:  func(ev *generator.Event) { ev.Pod.Meta = nil },
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				pod := ce.data["pod"].(map[string]any)
				for _, k := range []string{"labels", "annotations"} {
					if v, ok := pod[k]; ok {
						t.Errorf("data pod.%s = %v, want it left out", k, v)
					}
				}
			},
		},
		{
			name:   "a pod without labels writes empty labels and no annotations unless some are allowed",
			evType: generator.ContainerRemoved,
			event:  func(ev *generator.Event) { ev.Pod.Meta = generator.NewPodMeta(nil, nil) },
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				pod := ce.data["pod"].(map[string]any)
				if diff := cmp.Diff(map[string]any{}, pod["labels"]); diff != "" {
					t.Errorf("data pod.labels (-want +got):\n%s", diff)
				}
				if v, ok := pod["annotations"]; ok {
					t.Errorf("data pod.annotations = %v, want it left out", v)
				}
			},
		},
		{
			name:   "an unknown exit code is omitted",
			evType: generator.ContainerDied,
			event: func(ev *generator.Event) {
				ev.ExitCode = nil
				ev.State = generator.StateUnknown
				ev.Reason = ""
				ev.FinishedAt = time.Time{}
			},
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				for _, k := range []string{"exitCode", "reason", "finishedAt"} {
					if v, ok := ce.data[k]; ok {
						t.Errorf("data has %s = %v, want it left out", k, v)
					}
				}
				if ce.data["state"] != "unknown" {
					t.Errorf("data state = %v, want unknown", ce.data["state"])
				}
			},
		},
		{
			name:   "exit code 0 is written",
			evType: generator.ContainerDied,
			event: func(ev *generator.Event) {
				ev.ExitCode = exitCode(0)
				ev.Reason = "Completed"
			},
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				if v, ok := ce.data["exitCode"]; !ok || v != float64(0) {
					t.Errorf("data exitCode = %v (present %v), want 0", v, ok)
				}
			},
		},
		{
			name:   "time keeps the runtime's nanoseconds in UTC",
			evType: generator.ContainerStarted,
			event: func(ev *generator.Event) {
				ev.Time = time.Date(2026, 1, 2, 4, 4, 5, 123456789, time.FixedZone("CET", 3600))
			},
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				if ce.Time != "2026-01-02T03:04:05.123456789Z" {
					t.Errorf("time = %q, want 2026-01-02T03:04:05.123456789Z", ce.Time)
				}
			},
		},
		{
			name:   "time falls back to the observation time when the runtime gives none",
			evType: generator.ContainerRemoved,
			check: func(t *testing.T, _ *nats.Msg, ce structured) {
				if ce.Time != "2026-01-02T03:09:31.008Z" {
					t.Errorf("time = %q, want the observed time 2026-01-02T03:09:31.008Z", ce.Time)
				}
			},
		},
		{
			name:   "dots and wildcards in node, namespace and pod UID never reach the subject raw",
			opts:   publish.EncoderOptions{Node: "node.example.com"},
			evType: generator.ContainerDied,
			event: func(ev *generator.Event) {
				ev.Pod.UID = "a.*>b c"
				ev.Pod.Namespace = "ns.*>"
			},
			check: func(t *testing.T, msg *nats.Msg, ce structured) {
				want := "pleg." + schemas.EncodeToken("node.example.com") + "." + schemas.EncodeToken("ns.*>") + "." + schemas.EncodeToken("a.*>b c") + ".ContainerDied"
				if msg.Subject != want {
					t.Errorf("NATS subject = %q, want %q", msg.Subject, want)
				}
				tokens := strings.Split(msg.Subject, ".")
				if len(tokens) != 5 {
					t.Errorf("NATS subject %q has %d tokens, want 5", msg.Subject, len(tokens))
				}
				if strings.ContainsAny(msg.Subject, "*> \t") {
					t.Errorf("NATS subject %q holds a wildcard or whitespace", msg.Subject)
				}
				if ce.PodUID != "a.*>b c" {
					t.Errorf("poduid extension = %q, want the raw UID", ce.PodUID)
				}
			},
		},
		{
			name:   "a custom prefix starts the subject",
			opts:   publish.EncoderOptions{SubjectPrefix: "k8s.pleg"},
			evType: generator.ContainerStarted,
			check: func(t *testing.T, msg *nats.Msg, _ structured) {
				if !strings.HasPrefix(msg.Subject, "k8s.pleg.node-1.") {
					t.Errorf("NATS subject = %q, want prefix k8s.pleg.node-1.", msg.Subject)
				}
			},
		},
		{
			name:   "structured mode sets the content type and the message id",
			evType: generator.ContainerStarted,
			check: func(t *testing.T, msg *nats.Msg, ce structured) {
				want := nats.Header{
					"Nats-Msg-Id":  {publish.EventID(testContainerID, generator.ContainerStarted)},
					"Content-Type": {"application/cloudevents+json"},
				}
				if diff := cmp.Diff(want, msg.Header); diff != "" {
					t.Errorf("headers (-want +got):\n%s", diff)
				}
				if ce.ID != want.Get("Nats-Msg-Id") {
					t.Errorf("id = %q, want the Nats-Msg-Id %q", ce.ID, want.Get("Nats-Msg-Id"))
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			enc := newEncoder(t, tt.opts)
			ev := base[tt.evType]
			if tt.event != nil {
				tt.event(&ev)
			}
			msg := encode(t, enc, ev)
			ce := decodeStructured(t, msg.Data)
			schemastest.ValidateCloudEvent(t, msg.Data)
			tt.check(t, msg, ce)
		})
	}
}

func TestEncodeBinaryModePutsAttributesInHeadersAndDataInBody(t *testing.T) {
	ev := goldenEvents(t)[generator.ContainerDied]
	binary := newEncoder(t, publish.EncoderOptions{Mode: publish.ModeBinary, ClusterName: "prod"})
	msg := encode(t, binary, ev)

	id := publish.EventID(testContainerID, generator.ContainerDied)
	// Every attribute is a ce- header, datacontenttype included; there is
	// no Content-Type, which in the NATS binding would only say whether
	// the message is structured.
	want := nats.Header{
		"Nats-Msg-Id":        {id},
		"ce-specversion":     {"1.0"},
		"ce-id":              {id},
		"ce-source":          {"/clusters/prod/nodes/node-1"},
		"ce-type":            {"pleg.v1.ContainerDied"},
		"ce-subject":         {"default/web-0/app"},
		"ce-time":            {"2026-01-02T03:09:00.5Z"},
		"ce-datacontenttype": {"application/json"},
		"ce-dataschema":      {"https://pleg-bridge.dev/schemas/contract/2/v1/ContainerDied.json"},
		"ce-poduid":          {testPodUID},
		"ce-node":            {"node-1"},
		"ce-containerid":     {testContainerID},
	}
	if diff := cmp.Diff(want, msg.Header); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	schemastest.Validate(t, schemas.TypeContainerDied, msg.Data)

	// The body is the data of the structured encoding, byte for byte.
	structuredMsg := encode(t, newEncoder(t, publish.EncoderOptions{ClusterName: "prod"}), ev)
	if got, want := string(msg.Data), string(decodeStructured(t, structuredMsg.Data).Data); got != want {
		t.Errorf("binary body differs from structured data:\n got %s\nwant %s", got, want)
	}
}

func TestEncodeBinaryModeEscapesHeaderValues(t *testing.T) {
	ev := goldenEvents(t)[generator.ContainerStarted]
	ev.Pod.Name = "web\r\nX-Injected: 1"
	msg := encode(t, newEncoder(t, publish.EncoderOptions{Mode: publish.ModeBinary}), ev)
	if got, want := msg.Header.Get("ce-subject"), "default/web%0D%0AX-Injected:%201/app"; got != want {
		t.Errorf("ce-subject = %q, want %q", got, want)
	}
	if _, ok := msg.Header["X-Injected"]; ok {
		t.Error("a pod name injected a header")
	}
}

func TestEventIDDependsOnlyOnContainerAndType(t *testing.T) {
	enc := newEncoder(t, publish.EncoderOptions{})
	a := goldenEvents(t)[generator.ContainerDied]
	b := a
	b.DetectedBy = generator.SourceEvented
	b.ObservedAt = b.ObservedAt.Add(time.Minute)
	b.Reason = "Error"
	b.Pod.Name = "renamed"
	idA := encode(t, enc, a).Header.Get("Nats-Msg-Id")
	idB := encode(t, newEncoder(t, publish.EncoderOptions{Node: "other"}), b).Header.Get("Nats-Msg-Id")
	if idA != idB {
		t.Errorf("ids differ for the same container and type: %q and %q", idA, idB)
	}
	if idA != publish.EventID(testContainerID, generator.ContainerDied) {
		t.Errorf("id %q is not EventID(container, type)", idA)
	}
	// A fixed value: a change of the namespace or the name would change
	// every id, and a restarted bridge would republish what is stored.
	if got, want := publish.EventID("c1", generator.ContainerStarted), "2ea7994b-bb3a-5eb1-9ec4-9dc53bc750c6"; got != want {
		t.Errorf("EventID(c1, ContainerStarted) = %q, want %q", got, want)
	}
	ids := map[string]bool{}
	for _, typ := range generator.LifecycleEventTypes {
		for _, c := range []string{"c1", "c2"} {
			ids[publish.EventID(c, typ)] = true
		}
	}
	if len(ids) != 6 {
		t.Errorf("got %d distinct ids for 2 containers × 3 types, want 6", len(ids))
	}
}

func TestEncodeRejectsEventsItCannotPublishCorrectly(t *testing.T) {
	enc := newEncoder(t, publish.EncoderOptions{})
	base := goldenEvents(t)[generator.ContainerStarted]
	tests := []struct {
		name   string
		change func(ev *generator.Event)
		want   string
	}{
		{"an unknown Lifecycle event type", func(ev *generator.Event) { ev.Type = "ContainerChanged" }, `"ContainerChanged"`},
		{"an empty container ID", func(ev *generator.Event) { ev.Container.ID = "" }, "container ID is empty"},
		{"an empty pod UID", func(ev *generator.Event) { ev.Pod.UID = "" }, "pod UID is empty"},
		{"no observation time", func(ev *generator.Event) { ev.ObservedAt = time.Time{} }, "observed time is zero"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := base
			tt.change(&ev)
			_, err := enc.Encode(ev)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Encode() error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestEncodeStructuredIsTheStructuredBodyInEitherMode: what the state
// bucket holds is the event as the stream's structured messages carry it,
// also from an Encoder in binary mode, and it refuses what Encode refuses.
func TestEncodeStructuredIsTheStructuredBodyInEitherMode(t *testing.T) {
	structured := newEncoder(t, publish.EncoderOptions{})
	for _, mode := range []publish.Mode{publish.ModeStructured, publish.ModeBinary} {
		enc := newEncoder(t, publish.EncoderOptions{Mode: mode})
		for typ, ev := range goldenEvents(t) {
			t.Run(string(mode)+"/"+string(typ), func(t *testing.T) {
				got, err := enc.EncodeStructured(ev)
				if err != nil {
					t.Fatalf("EncodeStructured: %v", err)
				}
				if diff := cmp.Diff(string(encode(t, structured, ev).Data), string(got)); diff != "" {
					t.Errorf("EncodeStructured differs from the structured body (-Encode +EncodeStructured):\n%s", diff)
				}
			})
		}
		if enc.Node() != "node-1" {
			t.Errorf("Node() = %q, want node-1", enc.Node())
		}
		ev := goldenEvents(t)[generator.ContainerStarted]
		ev.Pod.UID = ""
		if _, err := enc.EncodeStructured(ev); err == nil || !strings.Contains(err.Error(), "pod UID is empty") {
			t.Errorf("EncodeStructured of an event without a pod UID: error %v, want one saying so", err)
		}
	}
}

func TestNewEncoderNamesTheBadValue(t *testing.T) {
	tests := []struct {
		name string
		opts publish.EncoderOptions
		want string
	}{
		{"an empty node", publish.EncoderOptions{SubjectPrefix: "pleg"}, "node name is empty"},
		{"a wildcard prefix", publish.EncoderOptions{Node: "n", SubjectPrefix: "pleg.*"}, `"pleg.*"`},
		{"an empty prefix", publish.EncoderOptions{Node: "n"}, `subject prefix ""`},
		{"an unknown mode", publish.EncoderOptions{Node: "n", SubjectPrefix: "pleg", Mode: "xml"}, `"xml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := publish.NewEncoder(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewEncoder(%+v) error = %v, want one containing %q", tt.opts, err, tt.want)
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, mode := range []publish.Mode{publish.ModeStructured, publish.ModeBinary} {
		b.Run(string(mode), func(b *testing.B) {
			enc := newEncoder(b, publish.EncoderOptions{Mode: mode})
			ev := goldenEvents(b)[generator.ContainerDied]
			b.ReportAllocs()
			for b.Loop() {
				if _, err := enc.Encode(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
