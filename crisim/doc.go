// Package crisim is a simulated container runtime: a real CRI
// RuntimeService gRPC server on a unix socket over an in-memory model of pod
// sandboxes and containers. The tests, the benchmarks, the demo command and
// the docker-compose development setup use it in place of containerd.
//
// It has three layers:
//
//   - Runtime (model.go, events.go) is the model. Its operations
//     (RunPodSandbox, CreateContainer, StartContainer, StopContainer,
//     RemoveContainer, StopPodSandbox, RemovePodSandbox) change state and
//     emit GetContainerEvents events shaped like containerd's: created_at in
//     nanoseconds, the pod sandbox status and the statuses of all the pod's
//     containers, none on a DELETED event. Options switch on the quirks of
//     real versions (containerd 1.7's shared event channel, 2.x's replay of
//     events kept while nobody listened, the odd payloads of a sandbox's
//     DELETED event). InjectSandbox, InjectContainer and InjectEvent store
//     malformed data verbatim, and Populate builds a large node without
//     events. A Runtime works without gRPC.
//   - Server (server.go) serves a Runtime over CRI: the read methods only,
//     every mutating method answers Unimplemented. It counts calls, so a
//     test can assert the bridge never mutates (MutatingCalls), and injects
//     faults: FailNext, SetLatency, DropStreams.
//   - Scenarios (scenario.go) drive a Runtime like a kubelet would:
//     Lifecycle for one pod, Churn for pods at a steady rate.
//
// A typical test:
//
//	rt := crisim.NewRuntime(crisim.Options{})
//	srv := crisim.NewServer(rt, crisim.ServerOptions{})
//	lis, err := crisim.Listen(filepath.Join(t.TempDir(), "cri.sock"))
//	...
//	go func() { errc <- srv.Serve(ctx, lis) }()  // clients may dial once Listen returned
//
// Timestamps come from time.Now, so the model, Lifecycle and Churn run on
// the virtual clock inside a testing/synctest bubble (keep the Server and
// its sockets outside of one).
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// crisim must not import the bridge's packages (cri, generator, statecache,
// publish, cmd), nor any other of the module: it stands for the runtime and
// knows nothing of the bridge. It imports only the CRI API, containerd's
// event API, gRPC and protobuf.
package crisim
