package schemas

import _ "embed"

// asyncAPI is the contract as an AsyncAPI 3.0 document.
//
//go:embed asyncapi.yaml
var asyncAPI []byte

// AsyncAPIFile is the path of the AsyncAPI document beside the JSON Schema
// files: its $refs to them ("v1/ContainerDied.json") are relative to it, so
// its own URI is SchemaBaseURI + AsyncAPIFile.
const AsyncAPIFile = "asyncapi.yaml"

// AsyncAPI returns a copy of the AsyncAPI 3.0 document (YAML) that
// describes the contract for tools: the channel <prefix>.<node>.<podUID>.<eventType>
// with its parameters, one message per CloudEvent type and content mode
// with its headers, and each payload by reference to the JSON Schema files
// (SchemaFiles), which stay the source of truth for the data.
func AsyncAPI() []byte { return append([]byte(nil), asyncAPI...) }
