// Command pleg-bridge publishes Kubernetes container lifecycle events from
// the node's CRI runtime to NATS JetStream as CloudEvents.
//
// The command keeps only what a command is for: the PLEG_* environment
// read into typed options (config.go), the logger, the signals, and the
// subcommands (commands.go). The bridge itself, its wiring and its shutdown
// order, is package bridge, which the demo and the latency benchmark run
// too.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// The command must not link anything of harness/: the agent every node runs
// carries none of the test harness. Its soak and fleet commands hand over
// to the harness's own binary, pleg-harness (harness.go).
package main
