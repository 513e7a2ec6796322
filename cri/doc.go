// Package cri is the bridge's client of the node's container runtime: the
// only code that touches the CRI's generated gRPC client, and the runtime
// the generator reads through its Runtime interface.
//
// It owns:
//   - the Client (cri.go): the connection to the CRI socket, its endpoint
//     (ParseEndpoint, DiscoverEndpoint), the unary calls and the event
//     stream, with capped reconnect backoff and fixed flow-control windows;
//   - the read-only guard (readonly.go): interceptors that refuse every
//     call but the read methods before it reaches the socket;
//   - the hand-written codec of the two listings and of the event stream
//     (listcodec.go), which decodes only what the generator reads and
//     skips the rest on the wire;
//   - the listing memo (listmemo.go), which reuses what the last full
//     listing decoded and gives the listings a version;
//   - the connection's bounded pool of frame buffers (framepool.go);
//   - containerd's task events (taskevents.go): the subscription to
//     containerd's event service on the same socket, and the decoding of
//     its envelopes into generator.TaskEvent.
//
// Client implements generator.Runtime, generator.Listings and
// generator.TaskEventSource; the wiring hands it to generator.New as the
// Runtime (under the metrics decorator) and, in the open, as
// Options.Listings and Options.TaskEvents.
//
// Why it is apart: what it holds is about the wire (gRPC options, protobuf
// field numbers, buffers, containerd's envelopes) and is measured and
// tested against a real gRPC server (crisim); the generator's merge,
// sources and cache need none of it and are tested against an in-memory
// runtime (generator/generatortest).
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// The import arrow points one way: cri imports generator for the
// interfaces it implements and the TaskEvent it produces, and
// internal/taskevent to decode containerd's events; generator must not
// import cri. It imports the CRI API, containerd's event API and gRPC; it
// must not import publish, NATS or anything under cmd.
package cri
