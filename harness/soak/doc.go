// Package soak checks the bridge's delivery guarantee under churn and
// faults, end to end: every container transition the runtime makes reaches
// JetStream exactly once and in per-container order (Started, Died,
// Removed), whatever fails meanwhile: NATS, its leaders, the bridge process,
// the runtime or its event stream.
//
// Run owns a whole soak: the simulated runtime (crisim) served on a unix
// socket, its own churn driver that records every transition it makes, NATS
// with JetStream (one embedded server or a three-server cluster), the bridge
// as a child process (the pleg-bridge binary's run command, so that a
// SIGKILL is a real one), the fault schedule, a health monitor of the
// bridge's /healthz, and at the end the accounting: each transition made
// against the messages the stream holds, per fault window (account.go, a
// pure function), and the bridge's state bucket against the runtime's
// containers (state.go): the faults must not leave it stale.
//
// With Options.Prometheus it also runs a real Prometheus and Alertmanager
// as child processes (prometheus.go): the shipped alerting rules, rendered
// with every time divided by AlertTimeScale (rules.go, from the shipped
// file, never a hand-kept copy), must fire as each fault expects, in time,
// and resolve after it, and nothing else may fire (alerts.go, the
// expectations and a pure judge; alerting.go, the faults held until their
// alerts fire); every query of the Grafana dashboard must answer
// (dashboard.go).
//
// The bridge is a black box here, seen only through its process, its HTTP
// endpoint and the stream.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// soak must not import cri, generator, statecache, publish, durable, the
// wiring package (bridge) or cmd, directly or through another package. Of
// the module it imports crisim (the runtime it drives), natsembed (the
// servers it runs), consumer (to decode what was stored, as any
// subscriber would) and harness/proc (its child processes); beyond it, the CRI API (to take back a refusal it
// queued), nats-server and nats.go among others. Nothing but the harness's
// command (harness/cmd/pleg-harness) and fleet imports it.
package soak
