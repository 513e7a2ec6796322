#!/usr/bin/env bash
# run.sh runs pleg-bridge's end-to-end tests against a real containerd: for
# each version (containerd 2.4.2, then 1.7.35) it sets up containerd, starts
# it on a private socket, runs `go test -tags e2e ./test/e2e/...` against it
# and stops it, whatever happened. It fails, loudly, if a runtime cannot be
# set up or started: it never skips.
#
#   bash test/e2e/run.sh                           # both versions
#   PLEG_E2E_VERSIONS=2.4.2 bash test/e2e/run.sh   # one
#   PLEG_E2E_RUN=TestExitBurst bash test/e2e/run.sh  # the tests matching a -run pattern
#
# Needs root on Linux, gcc, apt (for runc) and the Go module proxy. Built
# binaries are cached under ${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}.
set -euo pipefail
cd "$(dirname "$0")/../.."

versions=${PLEG_E2E_VERSIONS:-2.4.2 1.7.35}
script=test/e2e/containerd.sh

fail() {
	echo >&2
	echo "e2e: FAILED: $*" >&2
	exit 1
}

[ "$(id -u)" = 0 ] || fail "the end-to-end tests need root"
[ "$(uname -s)" = Linux ] || fail "the end-to-end tests need Linux"

workdir=
cleanup() {
	if [ -n "$workdir" ]; then
		bash "$script" stop "$workdir" || echo "e2e: WARNING: could not stop containerd in $workdir" >&2
		rm -rf "$workdir" || echo "e2e: WARNING: could not remove $workdir" >&2
		workdir=
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failed=()
summary=()
for v in $versions; do
	echo "== e2e: containerd $v: setup"
	t0=$SECONDS
	bash "$script" setup "$v" || fail "containerd $v cannot be set up (see above); the end-to-end tests did not run"
	workdir=$(mktemp -d /tmp/pleg-e2e-XXXXXX)
	echo "== e2e: containerd $v: start in $workdir"
	if ! bash "$script" start "$v" "$workdir"; then
		tail -n 50 "$workdir/containerd.log" >&2 || true
		fail "containerd $v does not start (log above); the end-to-end tests did not run"
	fi
	t1=$SECONDS
	echo "== e2e: containerd $v: tests"
	status=0
	PLEG_E2E_CONTAINERD_VERSION=$v PLEG_E2E_CONTAINERD_SOCKET=$workdir/containerd.sock \
		go test -tags e2e -count=1 -timeout 40m -v -run "${PLEG_E2E_RUN:-.}" ./test/e2e/... || status=$?
	t2=$SECONDS
	if [ "$status" != 0 ]; then
		echo "== e2e: containerd $v: tests FAILED; last lines of containerd's log:" >&2
		tail -n 30 "$workdir/containerd.log" >&2 || true
		failed+=("$v")
	fi
	cleanup
	summary+=("containerd $v: setup+start $((t1 - t0))s, tests $((t2 - t1))s, $([ "$status" = 0 ] && echo ok || echo FAILED)")
done

echo "== e2e: summary"
printf '  %s\n' "${summary[@]}"
[ ${#failed[@]} = 0 ] || fail "end-to-end tests failed against containerd ${failed[*]}"
echo "== e2e: all passed"
