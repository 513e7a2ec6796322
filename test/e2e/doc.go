// Package e2e holds pleg-bridge's end-to-end tests against a real
// containerd with runc. They are behind the e2e build tag, so `go test ./...`
// ignores them; test/e2e/run.sh builds what they need and runs them:
//
//	bash test/e2e/run.sh
//
// Each test builds the pleg-bridge binary, runs it as a subprocess configured
// only by PLEG_* variables against a private containerd and an in-process
// NATS server, drives pods through CRI itself, and checks the JetStream
// stream. containerd.sh builds, starts and stops the containerd; image/ is
// the one program in the test images and mkimages/ writes them.
package e2e
