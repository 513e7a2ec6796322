// Package fleet runs many nodes' bridges against one NATS JetStream
// cluster and accounts for every transition, to measure what a fleet
// costs the servers and to prove that faults at fleet scale lose nothing
// (docs/capacity.md, docs/measurements.md).
//
// Run owns a whole fleet run: N simulated nodes, each a crisim runtime
// served on a unix socket by the harness itself (a node's containerd
// outlives its bridge) with kubelet-like pods and a share of one
// fleet-wide churn (the soak's driver, stepped node by node); three
// nats-server processes in a cluster, with the stream and the state
// bucket at three replicas; the bridges, each a real bridge pipeline
// (package bridge) with its own node name, NATS connection and data
// directory, grouped into a few processes so that a fault can SIGKILL a
// process as a node's bridge would be; the fault schedule (rolling server
// restart, whole cluster down, bridge processes killed); a monitor that
// samples every child's memory and CPU from /proc and every bridge's
// pending events; and at the end the soak's accounting per fault window,
// the state bucket against the runtimes, and the stream's figures.
//
// The children are this same program re-executed (Options.ChildCommand
// runs RunChild): a server child runs one nats-server (nats-server/v2),
// a bridges child runs package bridge.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// fleet imports bridge, crisim, soak (its accounting, read-back and churn
// driver), harness/proc (its child processes), consumer, generator, publish and schemas (the event types, the
// streams' set-up and subjects) and the NATS libraries; it must not import
// cmd, and nothing but the harness's command (harness/cmd/pleg-harness)
// imports it.
package fleet
