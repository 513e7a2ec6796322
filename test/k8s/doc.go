// Package k8s holds pleg-bridge's tests on a real Kubernetes node: the image
// built offline (mkimage/), installed as docs/deployment.md says with
// `kubectl apply -k` (a credentials file) and with Helm (an NKey seed) into
// a single-node cluster without the Prometheus Operator's CRDs whose kubelet
// runs on the end-to-end tests' containerd, and checked against what the
// kubelet did; then the Prometheus Operator's component applied where its
// CRDs are; then the DaemonSet rolled with helm upgrade and helm rollback
// between builds and data directory formats while pods churn
// (upgrade_test.go), nothing lost or published twice. They are behind the
// k8s build tag, so `go test ./...` ignores them; test/k8s/run.sh builds
// and starts what they need and runs them, as root on Linux:
//
//	bash test/k8s/run.sh
//
// build.sh builds etcd and Kubernetes from the Go module proxy, cluster.sh
// starts and stops the cluster and puts the machine back as it was.
package k8s
