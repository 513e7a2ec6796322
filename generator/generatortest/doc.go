// Package generatortest holds test doubles for the generator: FakeRuntime, an
// in-memory Runtime over the simulated runtime's model (no gRPC, so it runs
// inside testing/synctest bubbles), and Recorder, a Sink that records events.
// Tests and the benchmarks (cmd/pleg-bench) import it; the product does not.
package generatortest
