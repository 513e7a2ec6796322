package schemas

import (
	"embed"
	"io/fs"
)

// SchemaBaseURI is the URI under which every schema's $id lives, with the
// contract version as a segment, so that an event's dataschema says which
// contract wrote it (see ContractVersion). A schema's path in SchemaFiles
// is its $id without this prefix, for example "v1/ContainerDied.json".
const SchemaBaseURI = schemaHome + contractSegment + ContractVersion + "/"

// schemaHome is where the schemas live: the SchemaBaseURI of the bridges
// before contract versions, whose dataschema has no contract segment
// (https://pleg-bridge.dev/schemas/v1/ContainerDied.json).
const schemaHome = "https://pleg-bridge.dev/schemas/"

// contractSegment comes before the contract version in SchemaBaseURI.
const contractSegment = "contract/"

// EventDataSchema is the $id of the base schema of the event data, which the
// schema of each CloudEvent type refers to and narrows.
const EventDataSchema = SchemaBaseURI + "v1/event-data.json"

var (
	//go:embed v1/*.json
	schemaFS embed.FS

	//go:embed examples/*.json
	exampleFS embed.FS
)

// Types returns the CloudEvent type values pleg-bridge publishes, in
// lifecycle order. Each call returns a new slice.
func Types() []string {
	return []string{TypeContainerStarted, TypeContainerDied, TypeContainerRemoved}
}

// typeName returns the file name stem for a CloudEvent type: its lifecycle
// event name.
func typeName(ceType string) (string, bool) {
	switch ceType {
	case TypeContainerStarted:
		return "ContainerStarted", true
	case TypeContainerDied:
		return "ContainerDied", true
	case TypeContainerRemoved:
		return "ContainerRemoved", true
	}
	return "", false
}

// DataSchema returns the $id of the JSON Schema that the data of a CloudEvent
// of type ceType follows: the value of its dataschema attribute. It reports
// false for a type pleg-bridge does not publish.
func DataSchema(ceType string) (uri string, ok bool) {
	name, ok := typeName(ceType)
	if !ok {
		return "", false
	}
	return SchemaBaseURI + "v1/" + name + ".json", true
}

// SchemaFiles returns the embedded JSON Schema files (draft 2020-12), the
// base schema and one per CloudEvent type, at the paths their $id gives under
// SchemaBaseURI ("v1/event-data.json", "v1/ContainerStarted.json", ...).
func SchemaFiles() fs.FS { return schemaFS }

// ExampleFiles returns the embedded example events, one complete CloudEvent
// in structured JSON per type, at "examples/<lifecycle event>.json" (for
// example "examples/ContainerDied.json").
func ExampleFiles() fs.FS { return exampleFS }

// Example returns a copy of the example CloudEvent, in structured JSON, for
// the type ceType. It reports false for a type pleg-bridge does not publish.
func Example(ceType string) ([]byte, bool) {
	name, ok := typeName(ceType)
	if !ok {
		return nil, false
	}
	b, err := exampleFS.ReadFile("examples/" + name + ".json")
	if err != nil {
		// Unreachable: the go:embed pattern and the tests guarantee the file.
		return nil, false
	}
	return b, true
}
