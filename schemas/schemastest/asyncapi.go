package schemastest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// asyncAPIMessages holds the compiled header and payload schemas of every
// message of the AsyncAPI document, compiled once for the test binary.
var asyncAPIMessages = sync.OnceValues(compileAsyncAPI)

// messageSchemas are the compiled schemas of one AsyncAPI message.
type messageSchemas struct {
	headers, payload *jsonschema.Schema
}

// AsyncAPI returns the embedded AsyncAPI document (schemas.AsyncAPI)
// decoded as encoding/json decodes JSON into an any: maps, slices, strings,
// float64 and bools. It fails t if the YAML does not parse.
func AsyncAPI(t testing.TB) map[string]any {
	t.Helper()
	j, err := yaml.YAMLToJSON(schemas.AsyncAPI())
	if err != nil {
		t.Fatalf("parse %s: %v", schemas.AsyncAPIFile, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(j, &doc); err != nil {
		t.Fatalf("decode %s: %v", schemas.AsyncAPIFile, err)
	}
	return doc
}

// compileAsyncAPI compiles the headers and payload of each message under
// components.messages as JSON Schema (draft 2020-12, which the document's
// schemas are written to satisfy), with the document at its URI beside the
// embedded schema files, so that its relative $refs reach them and nothing
// else.
func compileAsyncAPI() (map[string]messageSchemas, error) {
	j, err := yaml.YAMLToJSON(schemas.AsyncAPI())
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", schemas.AsyncAPIFile, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", schemas.AsyncAPIFile, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.UseLoader(noLoader{})
	if err := addSchemaFiles(c); err != nil {
		return nil, err
	}
	uri := schemas.SchemaBaseURI + schemas.AsyncAPIFile
	if err := c.AddResource(uri, doc); err != nil {
		return nil, fmt.Errorf("add %s: %w", schemas.AsyncAPIFile, err)
	}
	var parsed struct {
		Components struct {
			Messages map[string]json.RawMessage `json:"messages"`
		} `json:"components"`
	}
	if err := json.Unmarshal(j, &parsed); err != nil {
		return nil, fmt.Errorf("decode %s messages: %w", schemas.AsyncAPIFile, err)
	}
	out := make(map[string]messageSchemas)
	for _, id := range slices.Sorted(maps.Keys(parsed.Components.Messages)) {
		var m messageSchemas
		for _, part := range []struct {
			name string
			dst  **jsonschema.Schema
		}{{"headers", &m.headers}, {"payload", &m.payload}} {
			sch, err := c.Compile(uri + "#/components/messages/" + id + "/" + part.name)
			if err != nil {
				return nil, fmt.Errorf("compile %s of message %s: %w", part.name, id, err)
			}
			*part.dst = sch
		}
		out[id] = m
	}
	return out, nil
}

// CheckAsyncAPIMessage validates a NATS message against the message msgID
// of the AsyncAPI document's components: its headers (the first value of
// each, as strings) against the message's headers schema, and body, JSON,
// against its payload schema. It returns an error listing every violation,
// or naming an unknown message. It is safe for concurrent use.
func CheckAsyncAPIMessage(msgID string, headers map[string][]string, body []byte) error {
	all, err := asyncAPIMessages()
	if err != nil {
		return err
	}
	m, ok := all[msgID]
	if !ok {
		return fmt.Errorf("%s has no message %q", schemas.AsyncAPIFile, msgID)
	}
	h := make(map[string]any, len(headers))
	for k, v := range headers {
		if len(v) > 0 {
			h[k] = v[0]
		}
	}
	var errs []error
	if err := m.headers.Validate(h); err != nil {
		errs = append(errs, fmt.Errorf("headers of %s: %#v", msgID, err))
	}
	payload, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		errs = append(errs, fmt.Errorf("payload of %s is not JSON: %w", msgID, err))
	} else if err := m.payload.Validate(payload); err != nil {
		errs = append(errs, fmt.Errorf("payload of %s: %#v", msgID, err))
	}
	return errors.Join(errs...)
}
