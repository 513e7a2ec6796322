// Package schemas is pleg-bridge's wire contract, as the README's Subjects and
// Events sections describe it: the Go type of the CloudEvent data
// (EventData), the CloudEvent type values, the JSON Schema of the data for
// each type with an example event, the encoding of NATS subjects and of the
// state bucket's keys (statekey.go), the default stream name, subject prefix
// and state bucket, and the whole contract as an AsyncAPI 3.0 document
// (AsyncAPI) whose payloads refer to the JSON Schema files.
//
// The JSON Schema files are the source of truth for the data; they are
// embedded (SchemaFiles), so nothing here touches the network. A change to a
// contract field bumps the CloudEvent type's version and adds schema files.
// ContractVersion numbers the contract as a whole (subjects, attributes,
// streams); every event's dataschema carries it, and ParseDataSchema reads
// the dataschema of every version, those written before it included.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// Downstream consumers import this package, so it imports the standard
// library only: never CRI, gRPC, NATS or the other pleg-bridge packages. The
// schema validator is used by tests only, through package schemastest.
package schemas
