// Package publish turns generator Lifecycle events into CloudEvents and
// delivers them to NATS JetStream.
//
// It owns three things: the Event → CloudEvent encoding (Encoder, the wire
// contract of DESIGN.md §4 and §5), the stream setup (EnsureStream) and the
// asynchronous, per-pod ordered, at-least-once publishing (Publisher).
//
// publish imports generator for the Event type and the Sink interface only,
// and schemas for the data type and the subject encoding. It must not import
// CRI, gRPC or any other generator internals.
package publish
