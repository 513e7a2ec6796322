// Package bridge is the wiring of pleg-bridge: from typed Options it builds
// the runtime client, the generator, the publisher, the durable state (the
// checkpoint and the spool), the NATS connection (or an embedded server) and
// the HTTP endpoint of /metrics, /healthz and /readyz (and, with
// Options.StateBucket, the state bucket's writer, fed by the same acks as
// the checkpoint), and Bridge.Run runs
// them with one start and one shutdown order. It is the only copy of that
// wiring: the pleg-bridge command (run, demo), the latency benchmark and the
// fleet harness use it, the benchmark through Hooks, so that it measures the
// production pipeline, ack path included.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// bridge imports cri, generator, publish, statebucket, durable, natsembed,
// natsauth (to know a node's own credentials) and schemas, NATS and
// Prometheus. Nothing but the commands (cmd/pleg-bridge,
// harness/cmd/pleg-bench) and the harnesses that run the real pipeline
// (harness/latencybench, harness/fleet) imports it, and it must not import cmd, crisim or any test
// helper package.
package bridge
