// Package natsembed runs NATS servers with JetStream inside the process: the
// embedded server of the bridge's default mode (no PLEG_NATS_URL), the
// demo's, and the servers of tests and benchmarks.
//
// It is deployment, not publication: it owns starting, waiting for and
// describing servers, and nothing of what is published on them.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// It imports the nats-server library and the standard library only; it must
// not import publish, generator or anything of CRI.
package natsembed
