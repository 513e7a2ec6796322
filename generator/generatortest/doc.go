// Package generatortest holds test doubles for the generator: FakeRuntime, an
// in-memory Runtime over the simulated runtime's model (no gRPC, so it runs
// inside testing/synctest bubbles), and Recorder, a Sink that records events.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// Only test files import it (the tests and benchmarks of generator and
// cri); the product, the harnesses and the commands do not. It imports
// generator, crisim and internal/taskevent (to decode crisim's containerd
// events as the CRI client does), and must not import cri: it stands in
// for the CRI client, which imports generator.
package generatortest
