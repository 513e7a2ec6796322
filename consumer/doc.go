// Package consumer is what downstream Go services import to read the
// pleg-bridge event stream: it decodes the CloudEvents pleg-bridge publishes
// (structured and binary mode) into Event, builds JetStream filter subjects
// for a node, a pod or a Lifecycle event type (Filter), follows live events
// (Subscribe), reads history (Replay), lists the current containers of a
// node, a namespace, a pod or the cluster and then follows their changes
// from the bridges' state bucket (ListState, WatchState), and renders an
// event as one line of text (Format).
//
// It owns the subscriber's view of the wire contract (subjects and
// CloudEvents, as the README's Subjects and Events sections describe them);
// the encoding side lives in publish and the shared wire details (token
// encoding, subjects, the data type, the default stream and prefix) in
// schemas.
//
// It imports only the standard library, schemas and nats.go (with its
// jetstream package). It must not import CRI, gRPC, the CloudEvents SDK or
// any other pleg-bridge package, so that a downstream service pulls in
// nothing of the node agent.
package consumer
