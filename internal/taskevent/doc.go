// Package taskevent reads containerd's task-event envelopes as the
// generator's TaskEvents: Decode checks an envelope's namespace, topic and
// payload type and keeps what the trigger reads (the container, the exec,
// the exit status and time).
//
// Two parts decode the same envelopes and share it here: the CRI client
// (cri), which follows containerd's events on the CRI socket, and the
// generator's fake runtime (generator/generatortest), which serves the
// simulated runtime's events without gRPC.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// It imports generator for the TaskEvent it produces, and containerd's
// event types; it must not import cri, NATS or anything under cmd. Only
// cri and generator/generatortest import it (and tests).
package taskevent
