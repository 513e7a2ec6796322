#!/usr/bin/env bash
# run.sh runs pleg-bridge's tests on a real Kubernetes node: it builds (or
# finds in the cache) etcd, Kubernetes, containerd 2.4.2, helm and the test
# images, builds the pleg-bridge image from this checkout, starts a
# single-node cluster, imports the image into its containerd, runs
# `go test -tags k8s ./test/k8s/` and stops the cluster, whatever happened,
# putting the machine back as it was. It fails, loudly, if the cluster cannot
# be built or started: it never skips.
#
#   bash test/k8s/run.sh
#
# Needs root on Linux, gcc (containerd), apt (runc, the CNI plugins), openssl,
# curl and the Go module proxy. About 10 minutes with empty caches (mostly
# the Kubernetes build), about a minute and a half warm. Binaries are cached
# under ${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}, helm under
# ${XDG_CACHE_HOME:-$HOME/.cache}/pleg-bridge; set PLEG_K8S_KEEP=1 to leave
# the cluster running after the tests (stop it with cluster.sh stop).
set -euo pipefail
cd "$(dirname "$0")/../.."

helm_version=v3.22.0
image=localhost/pleg-bridge:e2e

fail() {
	echo >&2
	echo "k8s: FAILED: $*" >&2
	exit 1
}

[ "$(id -u)" = 0 ] || fail "the node tests need root"
[ "$(uname -s)" = Linux ] || fail "the node tests need Linux"

workdir=
cleanup() {
	if [ -n "$workdir" ] && [ "${PLEG_K8S_KEEP:-}" != 1 ]; then
		bash test/k8s/cluster.sh stop "$workdir" || { echo "k8s: FAILED to put the machine back as it was (above)" >&2; exit 1; }
		rm -rf "$workdir"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$SECONDS
echo "== k8s: setup (etcd, Kubernetes, containerd, CNI plugins, test images; cached)"
bash test/k8s/cluster.sh setup || fail "the cluster's binaries cannot be built (see above); the node tests did not run"

helm_dir="${XDG_CACHE_HOME:-$HOME/.cache}/pleg-bridge/helm-$helm_version"
if [ ! -x "$helm_dir/helm" ]; then
	echo "== k8s: building helm $helm_version"
	mkdir -p "$helm_dir"
	GOFLAGS= GOBIN="$helm_dir" go install "helm.sh/helm/v3/cmd/helm@$helm_version" || fail "cannot build helm"
fi

workdir=$(mktemp -d /tmp/pk8s-XXXXXX)
echo "== k8s: pleg-bridge image $image"
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
mkdir -p "$workdir/image"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$workdir/image/pleg-bridge" ./cmd/pleg-bridge
go run ./test/k8s/mkimage -binary "$workdir/image/pleg-bridge" -version "$version" -revision "$revision" \
	-ref "$image" -out "$workdir/image/pleg-bridge.tar"
t1=$SECONDS

echo "== k8s: cluster in $workdir"
bash test/k8s/cluster.sh start "$workdir" || fail "the cluster does not start (logs in $workdir/logs); the node tests did not run"
# shellcheck disable=SC1091
source "$workdir/env"
"$PLEG_K8S_CTR" --address "$PLEG_K8S_CONTAINERD_SOCKET" -n k8s.io images import "$workdir/image/pleg-bridge.tar" >/dev/null ||
	fail "cannot import the pleg-bridge image"
t2=$SECONDS

echo "== k8s: tests"
status=0
PLEG_K8S_IMAGE=$image PLEG_K8S_HELM="$helm_dir/helm" \
	go test -tags k8s -count=1 -timeout 15m -v ./test/k8s/ || status=$?
t3=$SECONDS
if [ "$status" != 0 ]; then
	for log in kubelet containerd; do
		echo "== k8s: last lines of the $log log" >&2
		tail -n 20 "$workdir/logs/$log.log" >&2 || true
	done
fi
cleanup
workdir=
t4=$SECONDS
echo "== k8s: setup and image $((t1 - t0))s, cluster start $((t2 - t1))s, tests $((t3 - t2))s, stop $((t4 - t3))s"
[ "$status" = 0 ] || fail "the node tests failed"
echo "== k8s: all passed"
