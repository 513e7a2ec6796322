package schemas_test

import (
	"encoding/json"
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

func TestDataSchema(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ceType string
		want   string
		ok     bool
	}{
		{"ContainerStarted has its own schema", schemas.TypeContainerStarted, "https://pleg-bridge.dev/schemas/contract/2/v1/ContainerStarted.json", true},
		{"ContainerDied has its own schema", schemas.TypeContainerDied, "https://pleg-bridge.dev/schemas/contract/2/v1/ContainerDied.json", true},
		{"ContainerRemoved has its own schema", schemas.TypeContainerRemoved, "https://pleg-bridge.dev/schemas/contract/2/v1/ContainerRemoved.json", true},
		{"a lifecycle name without the versioned prefix is unknown", "ContainerDied", "", false},
		{"another version is unknown", "pleg.v2.ContainerDied", "", false},
		{"the empty type is unknown", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := schemas.DataSchema(tt.ceType)
			if got != tt.want || ok != tt.ok {
				t.Errorf("DataSchema(%q) = %q, %v; want %q, %v", tt.ceType, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestSchemaFiles checks that the embedded files are exactly the base schema
// and one schema per type, each a draft 2020-12 schema whose $id is
// SchemaBaseURI followed by its path.
func TestSchemaFiles(t *testing.T) {
	t.Parallel()
	want := []string{strings.TrimPrefix(schemas.EventDataSchema, schemas.SchemaBaseURI)}
	for _, ceType := range schemas.Types() {
		uri, ok := schemas.DataSchema(ceType)
		if !ok {
			t.Fatalf("DataSchema(%q) is unknown, but Types lists it", ceType)
		}
		want = append(want, strings.TrimPrefix(uri, schemas.SchemaBaseURI))
	}
	var got []string
	err := fs.WalkDir(schemas.SchemaFiles(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		got = append(got, p)
		b, err := fs.ReadFile(schemas.SchemaFiles(), p)
		if err != nil {
			return err
		}
		var head struct {
			Schema string `json:"$schema"`
			ID     string `json:"$id"`
		}
		if err := json.Unmarshal(b, &head); err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		if head.Schema != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $schema = %q, want draft 2020-12", p, head.Schema)
		}
		if head.ID != schemas.SchemaBaseURI+p {
			t.Errorf("%s: $id = %q, want %q", p, head.ID, schemas.SchemaBaseURI+p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("embedded schema files (-want +got):\n%s", diff)
	}
}

// TestExamplesAreValid validates every embedded example event against the
// CloudEvent contract and its type's schema.
func TestExamplesAreValid(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(schemas.ExampleFiles(), "examples/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(files), len(schemas.Types()); got != want {
		t.Errorf("%d example files, want one per type (%d): %v", got, want, files)
	}
	for _, ceType := range schemas.Types() {
		t.Run(ceType, func(t *testing.T) {
			t.Parallel()
			b, ok := schemas.Example(ceType)
			if !ok {
				t.Fatalf("Example(%q) is missing", ceType)
			}
			schemastest.ValidateCloudEvent(t, b)
			var ev struct {
				Type string          `json:"type"`
				Data json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(b, &ev); err != nil {
				t.Fatal(err)
			}
			if ev.Type != ceType {
				t.Errorf("example for %q has type %q", ceType, ev.Type)
			}
			wantName := path.Join("examples", strings.TrimPrefix(ceType, "pleg.v1.")+".json")
			if !slices.Contains(files, wantName) {
				t.Errorf("no file %s", wantName)
			}

			// The Go type reads and writes the example's data without loss,
			// so EventData and the schema describe the same thing.
			var d schemas.EventData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatalf("decode data into EventData: %v", err)
			}
			again, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(decodeJSON(t, ev.Data), decodeJSON(t, again)); diff != "" {
				t.Errorf("data after an EventData round trip (-example +round trip):\n%s", diff)
			}
		})
	}
}

func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// TestEventDataIsValid checks that what the Go type writes passes the
// schema, including the zero values the contract says are always written.
func TestEventDataIsValid(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	zero := int32(0)
	tests := []struct {
		name   string
		ceType string
		data   schemas.EventData
	}{
		{
			name:   "a sandbox that started, with attempt 0 and sandbox false written",
			ceType: schemas.TypeContainerStarted,
			data: schemas.EventData{
				Node:       "node-1",
				Pod:        schemas.Pod{UID: "u1", Namespace: "default", Name: "web-0"},
				Container:  schemas.Container{ID: "c1", Sandbox: true},
				State:      "running",
				StartedAt:  &created,
				DetectedBy: "evented",
				ObservedAt: created,
			},
		},
		{
			name:   "a container that exited with code 0",
			ceType: schemas.TypeContainerDied,
			data: schemas.EventData{
				Node:       "node-1",
				Pod:        schemas.Pod{UID: "u1"},
				Container:  schemas.Container{ID: "c1", Name: "app", Attempt: 3},
				State:      "exited",
				ExitCode:   &zero,
				Reason:     "Completed",
				FinishedAt: &created,
				DetectedBy: "relist",
				ObservedAt: created,
			},
		},
		{
			name:   "a container found gone without an exit code",
			ceType: schemas.TypeContainerDied,
			data: schemas.EventData{
				Node:       "node-1",
				Pod:        schemas.Pod{UID: "u1"},
				Container:  schemas.Container{ID: "c1"},
				State:      "unknown",
				DetectedBy: "relist",
				ObservedAt: created,
			},
		},
		{
			name:   "a pod whose sandbox has no labels of its own writes empty labels",
			ceType: schemas.TypeContainerStarted,
			data: schemas.EventData{
				Node:       "node-1",
				Pod:        schemas.Pod{UID: "u1", Labels: map[string]string{}, Annotations: map[string]string{"team": "a"}},
				Container:  schemas.Container{ID: "c1", Sandbox: true},
				State:      "running",
				DetectedBy: "relist",
				ObservedAt: created,
			},
		},
		{
			name:   "a removed container",
			ceType: schemas.TypeContainerRemoved,
			data: schemas.EventData{
				Node:       "node-1",
				Pod:        schemas.Pod{UID: "u1"},
				Container:  schemas.Container{ID: "c1"},
				State:      "removed",
				DetectedBy: "relist",
				ObservedAt: created,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tt.data)
			if err != nil {
				t.Fatal(err)
			}
			schemastest.Validate(t, tt.ceType, b)
		})
	}
}

// exampleData returns the data of the type's example, decoded for editing.
func exampleData(t *testing.T, ceType string) map[string]any {
	t.Helper()
	b, ok := schemas.Example(ceType)
	if !ok {
		t.Fatalf("no example for %q", ceType)
	}
	var ev struct {
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.Data
}

func TestSchemaChecksData(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ceType string
		edit   func(d map[string]any)
		valid  bool
	}{
		{
			name:   "more top-level keys are allowed",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["restartCount"] = 2 },
			valid:  true,
		},
		{
			name:   "ContainerDied allows state unknown without an exit code",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["state"] = "unknown"; delete(d, "exitCode") },
			valid:  true,
		},
		{
			name:   "a missing pod uid is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { delete(d["pod"].(map[string]any), "uid") },
		},
		{
			name:   "an empty pod uid is rejected",
			ceType: schemas.TypeContainerStarted,
			edit:   func(d map[string]any) { d["pod"].(map[string]any)["uid"] = "" },
		},
		{
			name:   "a missing node is rejected",
			ceType: schemas.TypeContainerRemoved,
			edit:   func(d map[string]any) { delete(d, "node") },
		},
		{
			name:   "a container without sandbox is rejected",
			ceType: schemas.TypeContainerStarted,
			edit:   func(d map[string]any) { delete(d["container"].(map[string]any), "sandbox") },
		},
		{
			name:   "a negative attempt is rejected",
			ceType: schemas.TypeContainerStarted,
			edit:   func(d map[string]any) { d["container"].(map[string]any)["attempt"] = -1 },
		},
		{
			name:   "ContainerStarted with state exited is rejected",
			ceType: schemas.TypeContainerStarted,
			edit:   func(d map[string]any) { d["state"] = "exited" },
		},
		{
			name:   "ContainerDied with state running is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["state"] = "running" },
		},
		{
			name:   "ContainerRemoved with state exited is rejected",
			ceType: schemas.TypeContainerRemoved,
			edit:   func(d map[string]any) { d["state"] = "exited" },
		},
		{
			name:   "an unknown state is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["state"] = "stopped" },
		},
		{
			name:   "detectedBy other than relist or evented is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["detectedBy"] = "poll" },
		},
		{
			name:   "an exit code given as a string is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["exitCode"] = "137" },
		},
		{
			name:   "a fractional exit code is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["exitCode"] = 1.5 },
		},
		{
			name:   "an observedAt that is not a date-time is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["observedAt"] = "2026-01-02 03:09:00" },
		},
		{
			name:   "pod labels and annotations may be left out",
			ceType: schemas.TypeContainerDied,
			edit: func(d map[string]any) {
				delete(d["pod"].(map[string]any), "labels")
				delete(d["pod"].(map[string]any), "annotations")
			},
			valid: true,
		},
		{
			name:   "a pod label whose value is not a string is rejected",
			ceType: schemas.TypeContainerStarted,
			edit:   func(d map[string]any) { d["pod"].(map[string]any)["labels"] = map[string]any{"replicas": 3} },
		},
		{
			name:   "pod labels that are not an object are rejected",
			ceType: schemas.TypeContainerStarted,
			edit:   func(d map[string]any) { d["pod"].(map[string]any)["labels"] = []any{"app=web"} },
		},
		{
			name:   "a pod annotation whose value is not a string is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["pod"].(map[string]any)["annotations"] = map[string]any{"team": nil} },
		},
		{
			name:   "a known key with the wrong type is rejected",
			ceType: schemas.TypeContainerDied,
			edit:   func(d map[string]any) { d["reason"] = 7 },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := exampleData(t, tt.ceType)
			tt.edit(d)
			b, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			err = schemastest.Check(tt.ceType, b)
			if (err == nil) != tt.valid {
				t.Errorf("Check(%s, %s) = %v, want valid %v", tt.ceType, b, err, tt.valid)
			}
		})
	}
}

func TestCloudEventContract(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(ev map[string]any)
		want string // a fragment of the error
	}{
		{"specversion other than 1.0 is rejected", func(ev map[string]any) { ev["specversion"] = "0.3" }, "specversion"},
		{"a missing id is rejected", func(ev map[string]any) { delete(ev, "id") }, "attribute id is missing"},
		{"a missing poduid extension is rejected", func(ev map[string]any) { delete(ev, "poduid") }, "attribute poduid is missing"},
		{"a dataschema of another type is rejected", func(ev map[string]any) {
			ev["dataschema"] = "https://pleg-bridge.dev/schemas/contract/2/v1/ContainerStarted.json"
		}, "dataschema"},
		{"a dataschema of another type without a contract version is rejected", func(ev map[string]any) {
			ev["dataschema"] = "https://pleg-bridge.dev/schemas/v1/ContainerStarted.json"
		}, "dataschema"},
		{"a dataschema of another contract version is rejected", func(ev map[string]any) {
			ev["dataschema"] = "https://pleg-bridge.dev/schemas/contract/3/v1/ContainerDied.json"
		}, "dataschema"},
		{"the dataschema of a bridge from before contract versions is accepted", func(ev map[string]any) {
			ev["dataschema"] = "https://pleg-bridge.dev/schemas/v1/ContainerDied.json"
		}, ""},
		{"an unknown type is rejected", func(ev map[string]any) { ev["type"] = "pleg.v1.ContainerChanged" }, "not a pleg-bridge CloudEvent type"},
		{"a datacontenttype other than JSON is rejected", func(ev map[string]any) { ev["datacontenttype"] = "text/plain" }, "datacontenttype"},
		{"a time that is not RFC 3339 is rejected", func(ev map[string]any) { ev["time"] = "yesterday" }, "time"},
		{"a source of another node is rejected", func(ev map[string]any) { ev["source"] = "/nodes/node-2" }, "source"},
		{"a containerid that disagrees with the data is rejected", func(ev map[string]any) { ev["containerid"] = "other" }, "container.id"},
		{"invalid data is rejected", func(ev map[string]any) { ev["data"].(map[string]any)["state"] = "running" }, "data is invalid"},
		{"missing data is rejected", func(ev map[string]any) { delete(ev, "data") }, "data is missing"},
		{"a cluster-qualified source is accepted", func(ev map[string]any) { ev["source"] = "/clusters/prod/nodes/node-1" }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := schemas.Example(schemas.TypeContainerDied)
			var ev map[string]any
			if err := json.Unmarshal(b, &ev); err != nil {
				t.Fatal(err)
			}
			tt.edit(ev)
			b, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			err = schemastest.CheckCloudEvent(b)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("CheckCloudEvent: %v, want valid", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("CheckCloudEvent = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
