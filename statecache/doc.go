// Package statecache holds the status of each pod together with the time it
// was observed, the way the kubelet's runtime pod cache does.
//
// It owns one thing: deciding whether an observation is fresh enough to
// replace what is cached (Set refuses data older than what it holds), and
// letting callers wait until data newer than a given time arrives
// (GetNewerThan), either for one pod or for the whole node through the global
// timestamp (UpdateTime).
//
// The cache is generic in the status type, so it knows nothing of CRI, NATS
// or CloudEvents.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// It imports the standard library only; it must not import generator,
// publish, schemas, CRI or NATS packages.
package statecache
