package schemastest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// compiled holds the schema of each CloudEvent type, compiled once for the
// whole test binary; it is never changed after compileAll returns.
var compiled = sync.OnceValues(compileAll)

// compileAll compiles the schema of every type in schemas.Types from the
// embedded files. It asserts formats, so a malformed date-time fails.
func compileAll() (map[string]*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	// Only the embedded files are resources; a $ref to anything else fails
	// to load instead of reaching the network.
	c.UseLoader(noLoader{})
	if err := addSchemaFiles(c); err != nil {
		return nil, err
	}
	out := make(map[string]*jsonschema.Schema)
	for _, ceType := range schemas.Types() {
		uri, _ := schemas.DataSchema(ceType)
		sch, err := c.Compile(uri)
		if err != nil {
			return nil, fmt.Errorf("compile schema of %s: %w", ceType, err)
		}
		out[ceType] = sch
	}
	return out, nil
}

// addSchemaFiles adds every embedded schema file to c at its $id.
func addSchemaFiles(c *jsonschema.Compiler) error {
	files := schemas.SchemaFiles()
	err := fs.WalkDir(files, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := files.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		doc, err := jsonschema.UnmarshalJSON(f)
		if err != nil {
			return fmt.Errorf("parse schema %s: %w", path, err)
		}
		if err := c.AddResource(schemas.SchemaBaseURI+path, doc); err != nil {
			return fmt.Errorf("add schema %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load embedded schemas: %w", err)
	}
	return nil
}

// noLoader refuses every URL: all schemas come from the embedded files.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("load %s: not an embedded pleg-bridge schema", url)
}

// Check validates event data JSON against the schema of the CloudEvent type
// ceType and returns a readable error, listing every violation, if it is
// invalid or the type is unknown. It is safe for concurrent use.
func Check(ceType string, data []byte) error {
	all, err := compiled()
	if err != nil {
		return err
	}
	sch, ok := all[ceType]
	if !ok {
		return fmt.Errorf("no schema for CloudEvent type %q", ceType)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("parse %s data: %w", ceType, err)
	}
	if err := sch.Validate(inst); err != nil {
		if verr, ok := errors.AsType[*jsonschema.ValidationError](err); ok {
			// The Go syntax form lists each violation with its location.
			return fmt.Errorf("%s data is invalid: %#v", ceType, verr)
		}
		return fmt.Errorf("validate %s data: %w", ceType, err)
	}
	return nil
}

// Validate fails t, with every violation listed, unless data is valid event
// data for the CloudEvent type ceType. It is safe for concurrent use.
func Validate(t testing.TB, ceType string, data []byte) {
	t.Helper()
	if err := Check(ceType, data); err != nil {
		t.Errorf("%v\ndata: %s", err, data)
	}
}

// CheckCloudEvent checks a CloudEvent in structured JSON form against the
// attributes of the contract (the README's Events section): specversion "1.0"; id, source, type, subject,
// time (RFC 3339), datacontenttype "application/json", dataschema equal to
// schemas.DataSchema(type) (or to the type's dataschema without a contract
// version, which bridges wrote before contract versions), and the poduid, node and containerid extensions
// all present as non-empty strings; source ending in "/nodes/<node>" (the
// node name path-escaped); data
// valid for the type and agreeing with the extensions. It returns an error
// listing every problem found. It is safe for concurrent use.
func CheckCloudEvent(structured []byte) error {
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(structured, &ev); err != nil {
		return fmt.Errorf("parse structured CloudEvent: %w", err)
	}
	var problems []string
	attr := func(name string) string {
		raw, ok := ev[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("attribute %s is missing", name))
			return ""
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || s == "" {
			problems = append(problems, fmt.Sprintf("attribute %s is %s, want a non-empty string", name, raw))
		}
		return s
	}
	specversion := attr("specversion")
	attr("id")
	source := attr("source")
	ceType := attr("type")
	attr("subject")
	ceTime := attr("time")
	contentType := attr("datacontenttype")
	dataschema := attr("dataschema")
	podUID := attr("poduid")
	node := attr("node")
	containerID := attr("containerid")

	if specversion != "" && specversion != "1.0" {
		problems = append(problems, fmt.Sprintf("specversion is %q, want \"1.0\"", specversion))
	}
	if ceTime != "" {
		if _, err := time.Parse(time.RFC3339Nano, ceTime); err != nil {
			problems = append(problems, fmt.Sprintf("time %q is not RFC 3339", ceTime))
		}
	}
	if contentType != "" && contentType != "application/json" {
		problems = append(problems, fmt.Sprintf("datacontenttype is %q, want \"application/json\"", contentType))
	}
	if node != "" && source != "" && !strings.HasSuffix(source, "/nodes/"+url.PathEscape(node)) {
		problems = append(problems, fmt.Sprintf("source %q does not end in /nodes/%s", source, url.PathEscape(node)))
	}
	want, known := schemas.DataSchema(ceType)
	if ceType != "" && !known {
		problems = append(problems, fmt.Sprintf("type %q is not a pleg-bridge CloudEvent type", ceType))
	}
	// This contract's dataschema, or that of a bridge from before contract
	// versions, which a stream may still hold.
	if t, contract, _ := schemas.ParseDataSchema(dataschema); known && dataschema != "" && dataschema != want && (t != ceType || contract != "") {
		problems = append(problems, fmt.Sprintf("dataschema is %q, want %q", dataschema, want))
	}

	data, ok := ev["data"]
	switch {
	case !ok:
		problems = append(problems, "data is missing")
	case known:
		if err := Check(ceType, data); err != nil {
			problems = append(problems, err.Error())
		}
		var d schemas.EventData
		if err := json.Unmarshal(data, &d); err == nil {
			for _, c := range []struct{ ext, got, inData, field string }{
				{"poduid", podUID, d.Pod.UID, "pod.uid"},
				{"node", node, d.Node, "node"},
				{"containerid", containerID, d.Container.ID, "container.id"},
			} {
				if c.got != "" && c.got != c.inData {
					problems = append(problems, fmt.Sprintf("extension %s is %q but data %s is %q", c.ext, c.got, c.field, c.inData))
				}
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid CloudEvent:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

// ValidateCloudEvent fails t, with every problem listed, unless structured
// is a valid pleg-bridge CloudEvent in structured JSON form (see
// CheckCloudEvent). It is safe for concurrent use.
func ValidateCloudEvent(t testing.TB, structured []byte) {
	t.Helper()
	if err := CheckCloudEvent(structured); err != nil {
		t.Errorf("%v\nevent: %s", err, structured)
	}
}
