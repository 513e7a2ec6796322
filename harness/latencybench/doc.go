// Package latencybench measures detection latency: the time from a container
// transition in the runtime to the JetStream ack of its Lifecycle event, in
// evented and in generic mode, next to the raw JetStream publish→ack latency
// of messages of the same size, rate and server.
//
// Everything runs on loopback: an embedded NATS server with JetStream, the
// simulated runtime (crisim) served over a real unix socket, and the bridge
// itself, package bridge as the pleg-bridge command runs it: the real CRI
// client, generator, publisher and durable state (checkpoint and spool in a
// data directory of each run's own), with the production defaults but for
// the mode under test and the relist period. A driver makes the runtime
// start, stop and remove containers at a fixed rate; each transition is
// timed from just before the driver's call to the moment the bridge's OnAck
// hook reports the matching event (container ID and event type), after the
// checkpoint recorded it. With Config.Stages, the bridge's runtime and sink
// hooks also time each event at the stages visible from outside the
// generator and the publisher: stream arrival, hand-over to the publisher,
// queued, acked.
//
// The simulated runtime and its driver run in a child process by default
// (RuntimeProcess), as containerd runs beside the bridge on a node, so that
// their CPU use, allocations and garbage collection do not disturb the
// bridge's latencies: the harness re-executes its own executable, which
// takes that role in MaybeRunRuntimeProcess, and the child reports each
// transition, stamped with the wall clock both processes share, over a pipe
// (protocol.go). RuntimeInProcess keeps everything in one process. The NATS
// server always runs in the harness's process, beside the bridge.
//
// pleg-bench (harness/cmd/pleg-bench) prints the results as a table, and
// BenchmarkDetectionLatency runs the same harness briefly.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// Nothing but harness/cmd/pleg-bench may import this package. It imports package
// bridge as cmd/pleg-bridge does, crisim for the runtime and the CRI API
// for its event types, natsembed for the server, generator, publish and
// schemas for the events, their encoding and subjects, and harness/proc
// for the runtime's process; of the module, nothing else.
package latencybench
