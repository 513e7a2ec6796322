// Package generatortest holds test doubles for the generator: FakeRuntime, an
// in-memory Runtime over the simulated runtime's model (no gRPC, so it runs
// inside testing/synctest bubbles), and Recorder, a Sink that records events.
// Only tests import it.
package generatortest
