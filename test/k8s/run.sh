#!/usr/bin/env bash
# run.sh runs pleg-bridge's tests on a real Kubernetes node: it builds (or
# finds in the cache) etcd, Kubernetes, containerd 2.4.2, helm and the test
# images, builds the pleg-bridge image from this checkout (and, for the
# upgrade tests, the same source stamped with another version and an image
# of an older commit), starts a single-node cluster, imports the images into
# its containerd, runs `go test -tags k8s ./test/k8s/` and stops the
# cluster, whatever happened, putting the machine back as it was. It fails,
# loudly, if the cluster cannot be built or started: it never skips.
#
#   bash test/k8s/run.sh
#
# Needs root on Linux, gcc (containerd), apt (runc, the CNI plugins), openssl,
# curl, the Go module proxy and the repository's history (the older commit).
# About 10 minutes with empty caches (mostly the Kubernetes build), 5 to 8
# minutes warm, of which the upgrade tests take 3 to 5. Binaries are cached
# under ${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}, helm under
# ${XDG_CACHE_HOME:-$HOME/.cache}/pleg-bridge; set PLEG_K8S_KEEP=1 to leave
# the cluster running after the tests (stop it with cluster.sh stop), and
# PLEG_K8S_RUN=<regexp> to run only the tests it matches (go test -run).
set -euo pipefail
cd "$(dirname "$0")/../.."

helm_version=v3.22.0
image=localhost/pleg-bridge:e2e
image_b=localhost/pleg-bridge:e2e-b
image_old=localhost/pleg-bridge:e2e-old
# The commit of the previous data directory's format: the one before
# d9d0d8a, which added the stream's identity to the checkpoint.
old_commit=d56dc50

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
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
mkdir -p "$workdir/image"
# build_image <source dir> <version> <revision> <ref> <name>: the static
# binary of <source dir>'s cmd/pleg-bridge, stamped with <version> and
# <revision> as the Dockerfile stamps them (a build without main.commit
# ignores it), in an image built by this checkout's mkimage, as
# $workdir/image/<name>.tar.
build_image() {
	echo "== k8s: pleg-bridge image $4 (version $2)"
	(cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$2 -X main.commit=$3" \
		-o "$workdir/image/$5" ./cmd/pleg-bridge) ||
		fail "cannot build pleg-bridge $2 from $1"
	go run ./test/k8s/mkimage -binary "$workdir/image/$5" -version "$2" -revision "$3" \
		-ref "$4" -out "$workdir/image/$5.tar" || fail "cannot build the image $4"
}
build_image . "$version" "$revision" "$image" pleg-bridge
# The upgrade tests (upgrade_test.go) roll the DaemonSet from one build to
# another: the same source stamped with another version, and the last
# commit before d9d0d8a made the checkpoint name its stream, whose data
# directory is the previous one (format 2 without the stream's identity).
# It and its chart come from the repository's history with git archive,
# which touches neither this checkout nor its index: a clone without that
# commit (a shallow one) fails here, loudly.
build_image . "$version-b" "$revision" "$image_b" pleg-bridge-b
old_src="$workdir/old-src"
mkdir -p "$old_src"
git rev-parse --verify -q "$old_commit^{commit}" >/dev/null ||
	fail "commit $old_commit is not in this clone (a shallow clone?); the upgrade tests need it: git fetch --unshallow"
git archive "$old_commit" | tar -x -C "$old_src" || fail "cannot extract commit $old_commit"
build_image "$old_src" "$old_commit" "$(git rev-parse "$old_commit")" "$image_old" pleg-bridge-old
t1=$SECONDS

echo "== k8s: cluster in $workdir"
bash test/k8s/cluster.sh start "$workdir" || fail "the cluster does not start (logs in $workdir/logs); the node tests did not run"
# shellcheck disable=SC1091
source "$workdir/env"
for tar in pleg-bridge pleg-bridge-b pleg-bridge-old; do
	"$PLEG_K8S_CTR" --address "$PLEG_K8S_CONTAINERD_SOCKET" -n k8s.io images import "$workdir/image/$tar.tar" >/dev/null ||
		fail "cannot import the image $tar.tar"
done
t2=$SECONDS

echo "== k8s: tests"
status=0
PLEG_K8S_IMAGE=$image PLEG_K8S_IMAGE_B=$image_b PLEG_K8S_IMAGE_OLD=$image_old \
	PLEG_K8S_OLD_CHART="$old_src/deploy/helm/pleg-bridge" PLEG_K8S_OLD_COMMIT=$old_commit PLEG_K8S_HELM="$helm_dir/helm" \
	go test -tags k8s -count=1 -timeout 15m -v -run "${PLEG_K8S_RUN:-.}" ./test/k8s/ || status=$?
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
