// Package proc supervises the harnesses' child processes: the bridge of a
// soak, the NATS servers, bridge groups and raw publisher of a fleet,
// Prometheus and Alertmanager, the simulated runtime's process of the
// latency benchmark and pleg-bench's measured processes. One copy serves
// them all, so that a kill is the same SIGKILL, a stop the same SIGTERM (or
// end of stdin) with the same deadline, and a crash is told apart from an
// end the harness asked for in the same way everywhere.
//
// A Process is a command, an environment and where its output goes; each
// Start runs a new incarnation of it, so a harness restarts a killed child
// by starting it again. On Linux a child runs in a process group of its
// own, so that a terminal's Ctrl-C reaches the harness alone and the
// harness decides when its children stop, and the kernel kills it with
// SIGKILL if the harness dies first, so that no child outlives it holding
// ports and stores. Signals (Kill, Stop, Pause, Resume) go to the whole
// group.
//
// With Options.Lines the child's stdout is read line by line: Next returns
// the lines, and StartReady and Request speak the harnesses' child
// protocol, a line "ready" once the child is in its steady state, then one
// JSON line answering each line written to its stdin. Usage reads a
// process's memory and CPU from /proc (Linux only).
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// proc imports the standard library only. Nothing but the harnesses that
// run children imports it: soak, fleet, latencybench and pleg-bench
// (harness/cmd/pleg-bench).
package proc
