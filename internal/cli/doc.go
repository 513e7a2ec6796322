// Package cli holds what the project's commands share about a command
// line: usage errors and the exit status they give, running a cobra tree,
// and the one logger of a process. cmd/pleg-bridge and the harness's
// command (harness/cmd/pleg-harness) use it, so that both answer a mistake
// and log the same way.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// cli imports nothing of the module; beyond the standard library, cobra,
// tint and go-isatty. Nothing but the commands (cmd/pleg-bridge,
// harness/cmd/pleg-harness) imports it.
package cli
