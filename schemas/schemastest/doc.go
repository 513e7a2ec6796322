// Package schemastest checks JSON against pleg-bridge's wire contract in
// tests: event data against the JSON Schema of its CloudEvent type, and a
// structured CloudEvent against the attributes the contract requires
// (specversion, id, source, type, subject, time, dataschema and the
// extensions), and NATS messages against the messages of the AsyncAPI
// document (CheckAsyncAPIMessage).
//
// It loads the schemas embedded in package schemas, never from the network.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// Only tests import it: it pulls in a JSON Schema validator and a YAML
// parser that the binary and the downstream consumers must not carry. Of
// the module it imports schemas only.
package schemastest
