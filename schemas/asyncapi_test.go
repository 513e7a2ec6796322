package schemas_test

import (
	"encoding/json"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// get walks doc along path (map keys, or decimal indexes into slices) and
// fails t if any step is missing.
func get(t *testing.T, doc any, path ...string) any {
	t.Helper()
	v := doc
	for i, k := range path {
		switch n := v.(type) {
		case map[string]any:
			next, ok := n[k]
			if !ok {
				t.Fatalf("%s: no %s", schemas.AsyncAPIFile, strings.Join(path[:i+1], "."))
			}
			v = next
		case []any:
			idx, err := strconv.Atoi(k)
			if err != nil || idx < 0 || idx >= len(n) {
				t.Fatalf("%s: no %s", schemas.AsyncAPIFile, strings.Join(path[:i+1], "."))
			}
			v = n[idx]
		default:
			t.Fatalf("%s: %s is not an object or array", schemas.AsyncAPIFile, strings.Join(path[:i], "."))
		}
	}
	return v
}

func str(t *testing.T, doc any, path ...string) string {
	t.Helper()
	s, ok := get(t, doc, path...).(string)
	if !ok {
		t.Fatalf("%s: %s is not a string", schemas.AsyncAPIFile, strings.Join(path, "."))
	}
	return s
}

func strs(t *testing.T, doc any, path ...string) []string {
	t.Helper()
	var out []string
	for _, v := range get(t, doc, path...).([]any) {
		out = append(out, v.(string))
	}
	return out
}

// lifecycleNames are the Lifecycle event types of schemas.Types.
func lifecycleNames() []string {
	var out []string
	for _, ceType := range schemas.Types() {
		out = append(out, ceType[strings.LastIndexByte(ceType, '.')+1:])
	}
	return out
}

// messageTypes maps each message of components.messages to the CloudEvent
// type it carries and its content mode, as the document says them: a
// structured message fixes the body's type, a binary one the ce-type header.
func messageTypes(t *testing.T, doc map[string]any) map[string][2]string {
	t.Helper()
	out := map[string][2]string{}
	for id, m := range get(t, doc, "components", "messages").(map[string]any) {
		switch ct := str(t, m, "contentType"); ct {
		case "application/cloudevents+json":
			out[id] = [2]string{str(t, m, "payload", "allOf", "1", "properties", "type", "const"), "structured"}
		case "application/json":
			out[id] = [2]string{str(t, m, "headers", "allOf", "1", "properties", "ce-type", "const"), "binary"}
		default:
			t.Errorf("message %s has content type %q, neither mode's", id, ct)
		}
	}
	return out
}

// refs returns every $ref in v.
func refs(v any) []string {
	var out []string
	switch n := v.(type) {
	case map[string]any:
		if r, ok := n["$ref"].(string); ok {
			out = append(out, r)
		}
		for _, c := range n {
			out = append(out, refs(c)...)
		}
	case []any:
		for _, c := range n {
			out = append(out, refs(c)...)
		}
	}
	return out
}

func TestAsyncAPIDescribesTheChannel(t *testing.T) {
	t.Parallel()
	doc := schemastest.AsyncAPI(t)
	if got := str(t, doc, "asyncapi"); got != "3.0.0" {
		t.Errorf("asyncapi = %q, want 3.0.0", got)
	}
	ch := get(t, doc, "channels", "lifecycleEvents")
	address := str(t, ch, "address")
	if address != "{prefix}.{node}.{namespace}.{podUID}.{eventType}" {
		t.Errorf("address = %q, want the subject scheme {prefix}.{node}.{namespace}.{podUID}.{eventType}", address)
	}
	var inAddress []string
	for _, m := range regexp.MustCompile(`\{([^}]*)\}`).FindAllStringSubmatch(address, -1) {
		inAddress = append(inAddress, m[1])
	}
	params := get(t, ch, "parameters").(map[string]any)
	if diff := cmp.Diff(slices.Sorted(slices.Values(inAddress)), slices.Sorted(maps.Keys(params))); diff != "" {
		t.Errorf("address parameters (-in address +declared):\n%s", diff)
	}
	if got := str(t, params, "prefix", "default"); got != schemas.DefaultSubjectPrefix {
		t.Errorf("prefix default = %q, want %q", got, schemas.DefaultSubjectPrefix)
	}
	if diff := cmp.Diff(lifecycleNames(), strs(t, params, "eventType", "enum")); diff != "" {
		t.Errorf("eventType enum (-published +documented):\n%s", diff)
	}
	for _, p := range []string{"node", "namespace", "podUID"} {
		for _, ex := range strs(t, params, p, "examples") {
			if raw, err := schemas.DecodeToken(ex); err != nil || schemas.EncodeToken(raw) != ex {
				t.Errorf("%s example %q is not an encoded token: %v", p, ex, err)
			}
		}
	}
}

func TestAsyncAPINamesEveryTypeInBothModes(t *testing.T) {
	t.Parallel()
	doc := schemastest.AsyncAPI(t)
	got := map[[2]string]string{}
	for id, tm := range messageTypes(t, doc) {
		if other, ok := got[tm]; ok {
			t.Errorf("messages %s and %s both carry %s in %s mode", id, other, tm[0], tm[1])
		}
		got[tm] = id
	}
	var want, have []string
	for _, ceType := range schemas.Types() {
		want = append(want, ceType+" binary", ceType+" structured")
	}
	for tm := range got {
		have = append(have, tm[0]+" "+tm[1])
	}
	slices.Sort(want)
	slices.Sort(have)
	if diff := cmp.Diff(want, have); diff != "" {
		t.Errorf("types and modes of the messages (-published +documented):\n%s", diff)
	}

	// The channel offers every message and the operation sends them all.
	var components []string
	for id := range get(t, doc, "components", "messages").(map[string]any) {
		components = append(components, "#/components/messages/"+id)
	}
	slices.Sort(components)
	var onChannel []string
	for id, m := range get(t, doc, "channels", "lifecycleEvents", "messages").(map[string]any) {
		onChannel = append(onChannel, str(t, m, "$ref"))
		if want := "#/components/messages/" + id; str(t, m, "$ref") != want {
			t.Errorf("channel message %s refers to %s, want %s", id, str(t, m, "$ref"), want)
		}
	}
	slices.Sort(onChannel)
	if diff := cmp.Diff(components, onChannel); diff != "" {
		t.Errorf("channel messages (-components +channel):\n%s", diff)
	}
	var sent []string
	for _, m := range get(t, doc, "operations", "publishLifecycleEvents", "messages").([]any) {
		sent = append(sent, strings.Replace(str(t, m, "$ref"), "#/channels/lifecycleEvents/messages/", "#/components/messages/", 1))
	}
	slices.Sort(sent)
	if diff := cmp.Diff(components, sent); diff != "" {
		t.Errorf("operation messages (-components +operation):\n%s", diff)
	}
}

func TestAsyncAPIRefersToTheSchemaFiles(t *testing.T) {
	t.Parallel()
	doc := schemastest.AsyncAPI(t)
	var want []string
	for _, ceType := range schemas.Types() {
		uri, _ := schemas.DataSchema(ceType)
		want = append(want, strings.TrimPrefix(uri, schemas.SchemaBaseURI))
	}
	files := map[string]bool{}
	for _, r := range refs(doc) {
		if strings.HasPrefix(r, "#") {
			// An internal reference must resolve.
			path := strings.Split(strings.TrimPrefix(r, "#/"), "/")
			get(t, doc, path...)
			continue
		}
		files[r] = true
		if _, err := fs.Stat(schemas.SchemaFiles(), r); err != nil {
			t.Errorf("$ref %s is not an embedded schema file: %v", r, err)
		}
	}
	if diff := cmp.Diff(want, slices.Sorted(maps.Keys(files)), cmp.Transformer("sort", func(s []string) []string { return slices.Sorted(slices.Values(s)) })); diff != "" {
		t.Errorf("schema files referred to (-one per type +documented):\n%s", diff)
	}

	// Each message's data is its own type's schema, and the dataschema it
	// fixes is that schema's $id.
	for id, tm := range messageTypes(t, doc) {
		uri, _ := schemas.DataSchema(tm[0])
		file := strings.TrimPrefix(uri, schemas.SchemaBaseURI)
		m := get(t, doc, "components", "messages", id)
		var ref, dataschema string
		if tm[1] == "structured" {
			ref = str(t, m, "payload", "allOf", "1", "properties", "data", "$ref")
			dataschema = str(t, m, "payload", "allOf", "1", "properties", "dataschema", "const")
		} else {
			ref = str(t, m, "payload", "$ref")
			dataschema = str(t, m, "headers", "allOf", "1", "properties", "ce-dataschema", "const")
		}
		if ref != file || dataschema != uri {
			t.Errorf("message %s (%s) refers to %s with dataschema %s, want %s and %s", id, tm[0], ref, dataschema, file, uri)
		}
	}
}

// TestAsyncAPIMessagesAcceptTheExamples validates each example event, as
// a structured message and, taken apart, as a binary one, against the
// document's messages, and checks that they refuse what the contract does.
func TestAsyncAPIMessagesAcceptTheExamples(t *testing.T) {
	t.Parallel()
	for _, ceType := range schemas.Types() {
		name := ceType[strings.LastIndexByte(ceType, '.')+1:]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			body, _ := schemas.Example(ceType)
			var ce map[string]json.RawMessage
			if err := json.Unmarshal(body, &ce); err != nil {
				t.Fatal(err)
			}
			var id string
			if err := json.Unmarshal(ce["id"], &id); err != nil {
				t.Fatal(err)
			}
			structuredHeaders := map[string][]string{"Content-Type": {"application/cloudevents+json"}, "Nats-Msg-Id": {id}}
			binaryHeaders := map[string][]string{"Nats-Msg-Id": {id}}
			for k, v := range ce {
				if k == "data" {
					continue
				}
				var s string
				if err := json.Unmarshal(v, &s); err != nil {
					t.Fatalf("attribute %s: %v", k, err)
				}
				binaryHeaders["ce-"+k] = []string{s}
			}
			data := []byte(ce["data"])

			if err := schemastest.CheckAsyncAPIMessage(name+"Structured", structuredHeaders, body); err != nil {
				t.Errorf("structured: %v", err)
			}
			if err := schemastest.CheckAsyncAPIMessage(name+"Binary", binaryHeaders, data); err != nil {
				t.Errorf("binary: %v", err)
			}

			other := "ContainerStarted"
			if name == other {
				other = "ContainerDied"
			}
			refused := []struct {
				what, msg string
				headers   map[string][]string
				body      []byte
			}{
				{"a structured event as another type's message", other + "Structured", structuredHeaders, body},
				{"a binary event as another type's message", other + "Binary", binaryHeaders, data},
				{"a structured event without Content-Type", name + "Structured", map[string][]string{"Nats-Msg-Id": {id}}, body},
				{"a binary event with a Content-Type", name + "Binary", with(binaryHeaders, "Content-Type", "application/json"), data},
				{"a binary event without ce-datacontenttype", name + "Binary", with(binaryHeaders, "ce-datacontenttype", ""), data},
				{"a binary event whose ce-time is no time", name + "Binary", with(binaryHeaders, "ce-time", "yesterday"), data},
				{"the whole CloudEvent as a binary body", name + "Binary", binaryHeaders, body},
			}
			for _, r := range refused {
				if err := schemastest.CheckAsyncAPIMessage(r.msg, r.headers, r.body); err == nil {
					t.Errorf("%s is accepted", r.what)
				}
			}
		})
	}
}

// with returns a copy of h with k set to v, or removed if v is empty.
func with(h map[string][]string, k, v string) map[string][]string {
	out := maps.Clone(h)
	if v == "" {
		delete(out, k)
	} else {
		out[k] = []string{v}
	}
	return out
}

// TestAsyncAPINamesTheContractVersion: the document lives beside the
// schema files of its contract, and its version is the contract version.
func TestAsyncAPINamesTheContractVersion(t *testing.T) {
	t.Parallel()
	doc := schemastest.AsyncAPI(t)
	if got, want := str(t, doc, "id"), schemas.SchemaBaseURI+schemas.AsyncAPIFile; got != want {
		t.Errorf("id = %q, want %q", got, want)
	}
	if got := str(t, doc, "info", "version"); got != schemas.ContractVersion {
		t.Errorf("info.version = %q, want the contract version %q", got, schemas.ContractVersion)
	}
}
