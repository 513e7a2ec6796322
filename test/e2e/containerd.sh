#!/usr/bin/env bash
# containerd.sh builds, starts and stops a private containerd for pleg-bridge's
# end-to-end tests. Nothing is pulled from a container registry: containerd
# comes from the Go module proxy, runc from apt, and the two test images are
# built locally from test/e2e/image and imported with ctr.
#
#   containerd.sh setup [2.4.2|1.7.35]     build containerd, ctr and the runc shim
#                                          (cached), install runc, build the images
#   containerd.sh start <version> <workdir> write <workdir>/config.toml, start
#                                          containerd on <workdir>/containerd.sock,
#                                          wait for it, import the images (k8s.io)
#   containerd.sh stop <workdir>           kill what runs in it, stop containerd,
#                                          unmount everything under <workdir>
#   containerd.sh kill-daemon <workdir>    stop only the containerd process (shims
#                                          and containers keep running), as in a
#                                          runtime restart; `start` brings it back
#
# Binaries are cached under ${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}/<version>/bin
# and the images under ${PLEG_E2E_CACHE}/images; a second setup reuses them.
# Needs root, Linux, a C compiler (cgo) and apt for runc.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}
build_tags="no_btrfs no_devmapper no_zfs no_aufs"

# The image names; the tests use the same ones (test/e2e/main_test.go).
pause_image=localhost/pleg-e2e/pause:1
work_image=localhost/pleg-e2e/work:1

die() { echo "containerd.sh: $*" >&2; exit 1; }
log() { echo "containerd.sh: $*" >&2; }

check_version() {
	case "$1" in
	2.4.2 | 1.7.35) ;;
	*) die "unsupported containerd version '$1' (want 2.4.2 or 1.7.35)" ;;
	esac
}

bindir() { echo "$cache/$1/bin"; }

have_binaries() {
	local d
	d=$(bindir "$1")
	[ -x "$d/containerd" ] && [ -x "$d/ctr" ] && [ -x "$d/containerd-shim-runc-v2" ]
}

build_containerd() {
	local v=$1 d tmp
	d=$(bindir "$v")
	if have_binaries "$v"; then
		log "containerd $v: cached in $d"
		return
	fi
	command -v go >/dev/null || die "go is not installed"
	command -v gcc >/dev/null || die "gcc is needed to build containerd (cgo); apt-get install gcc"
	mkdir -p "$d"
	tmp=$(mktemp -d "$cache/$v/build.XXXXXX")
	log "containerd $v: building into $d (a few minutes on a cold cache)"
	case "$v" in
	2.*)
		(cd "$tmp" && GOBIN="$tmp" GOFLAGS= CGO_ENABLED=1 go install -trimpath -tags "$build_tags" \
			"github.com/containerd/containerd/v2/cmd/containerd@v$v" \
			"github.com/containerd/containerd/v2/cmd/ctr@v$v" \
			"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v$v")
		;;
	1.*)
		# go install pkg@v1.7.x refuses a go.mod with exclude directives, so
		# build inside the downloaded (read-only) module instead.
		local src
		src=$(cd "$tmp" && GOFLAGS= go mod download -json "github.com/containerd/containerd@v$v" |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[ -n "$src" ] && [ -d "$src" ] || die "containerd $v: go mod download gave no source directory"
		for cmd in containerd ctr containerd-shim-runc-v2; do
			(cd "$src" && GOFLAGS= CGO_ENABLED=1 go build -mod=mod -trimpath -tags "$build_tags" \
				-o "$tmp/$cmd" "./cmd/$cmd")
		done
		;;
	esac
	for cmd in containerd ctr containerd-shim-runc-v2; do
		[ -x "$tmp/$cmd" ] || die "containerd $v: $cmd was not built"
		mv -f "$tmp/$cmd" "$d/$cmd"
	done
	rm -rf "$tmp"
	"$d/containerd" --version >&2
}

install_runc() {
	if command -v runc >/dev/null; then
		log "runc: $(command -v runc) ($(runc --version | head -1))"
		return
	fi
	command -v apt-get >/dev/null || die "runc is missing and apt-get is not available to install it"
	log "runc: installing from apt"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >&2
	command -v runc >/dev/null || die "runc is still missing after apt-get install runc"
}

# build_images writes $cache/images/images.tar from the current sources; it
# is rebuilt only when a source file is newer than the archive.
build_images() {
	local d=$cache/images
	mkdir -p "$d"
	if [ -s "$d/images.tar" ] &&
		[ -z "$(find "$repo/test/e2e/image" "$repo/test/e2e/mkimages" -newer "$d/images.tar" -type f)" ]; then
		log "images: cached in $d/images.tar"
		return
	fi
	log "images: building $pause_image and $work_image"
	(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$d/pleg-e2e" ./test/e2e/image)
	(cd "$repo" && go run ./test/e2e/mkimages -binary "$d/pleg-e2e" -out "$d/images.tar.tmp" \
		-pause "$pause_image" -work "$work_image")
	mv -f "$d/images.tar.tmp" "$d/images.tar"
}

cmd_setup() {
	local v=${1:-2.4.2}
	check_version "$v"
	[ "$(id -u)" = 0 ] || die "setup needs root"
	[ "$(uname -s)" = Linux ] || die "setup needs Linux"
	build_containerd "$v"
	install_runc
	build_images
}

write_config() {
	local v=$1 w=$2 runc_path
	runc_path=$(command -v runc)
	case "$v" in
	2.*)
		# Config version 3; keys checked against containerd v2.4.2's
		# docs/cri/config.md and internal/cri/config/config.go.
		cat >"$w/config.toml" <<EOF
version = 3
root = "$w/root"
state = "$w/state"

[grpc]
  address = "$w/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$pause_image"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$runc_path"
        Root = "$w/runc"
        SystemdCgroup = false
EOF
		;;
	1.*)
		# Config version 2; keys checked against containerd v1.7.35's
		# docs/cri/config.md and pkg/cri/config/config.go.
		cat >"$w/config.toml" <<EOF
version = 2
root = "$w/root"
state = "$w/state"

[grpc]
  address = "$w/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$runc_path"
        Root = "$w/runc"
        SystemdCgroup = false
EOF
		;;
	esac
}

ctr_() { "$(bindir "$(cat "$1/version")")/ctr" --address "$1/containerd.sock" "${@:2}"; }

daemon_pid() {
	local w=$1 pid
	[ -f "$w/containerd.pid" ] || return 1
	pid=$(cat "$w/containerd.pid")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

cmd_start() {
	[ $# = 2 ] || die "usage: start <version> <workdir>"
	local v=$1 w d pid i
	check_version "$v"
	have_binaries "$v" || die "containerd $v is not built: run '$0 setup $v' first"
	[ -s "$cache/images/images.tar" ] || die "the test images are not built: run '$0 setup $v' first"
	command -v runc >/dev/null || die "runc is not installed: run '$0 setup $v' first"
	mkdir -p "$2"
	w=$(cd "$2" && pwd)
	# A unix socket path must fit in 108 bytes.
	[ ${#w} -le 80 ] || die "workdir path too long for a unix socket: $w"
	if pid=$(daemon_pid "$w"); then
		die "containerd already runs in $w (pid $pid)"
	fi
	d=$(bindir "$v")
	echo "$v" >"$w/version"
	write_config "$v" "$w"
	log "starting containerd $v in $w (log: $w/containerd.log)"
	# setsid: the daemon must outlive this script and not get its signals.
	PATH="$d:$PATH" setsid "$d/containerd" --config "$w/config.toml" >>"$w/containerd.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >"$w/containerd.pid"
	# Wait until it answers, at most 60 s.
	for i in $(seq 1 120); do
		if "$d/ctr" --address "$w/containerd.sock" --timeout 2s version >/dev/null 2>&1; then
			break
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 30 "$w/containerd.log" >&2
			die "containerd $v exited at start; see $w/containerd.log"
		fi
		[ "$i" = 120 ] && { tail -n 30 "$w/containerd.log" >&2; die "containerd $v did not answer on $w/containerd.sock within 60s"; }
		sleep 0.5
	done
	ctr_ "$w" -n k8s.io images import "$cache/images/images.tar" >&2 ||
		die "import of the test images failed"
	# List first: grep -q in a pipeline could make ctr die of SIGPIPE, which
	# pipefail would report as a failure.
	local images
	images=$(ctr_ "$w" -n k8s.io images ls -q) || die "cannot list images"
	for ref in "$pause_image" "$work_image"; do
		grep -qx "$ref" <<<"$images" || die "image $ref is missing after import"
	done
	log "containerd $v ready on $w/containerd.sock"
}

# stop_daemon sends SIGTERM to containerd and waits for it, at most 30 s,
# then SIGKILL.
stop_daemon() {
	local w=$1 pid i
	pid=$(daemon_pid "$w") || return 0
	kill -TERM "$pid"
	for i in $(seq 1 60); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "containerd (pid $pid) ignored SIGTERM for 30s; killing it"
		kill -KILL "$pid" || true
	fi
	rm -f "$w/containerd.pid"
}

cmd_kill_daemon() {
	[ $# = 1 ] || die "usage: kill-daemon <workdir>"
	local w
	w=$(cd "$1" && pwd)
	stop_daemon "$w"
	log "containerd in $w stopped; its shims keep running"
}

# shim_pids prints the shims started by the containerd of workdir $1: their
# command line names its socket.
shim_pids() {
	local w=$1 p
	for p in /proc/[0-9]*; do
		case "$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" in
		*"-address $w/containerd.sock "*) echo "${p#/proc/}" ;;
		esac
	done
	return 0
}

# child_pids prints the PIDs whose parent is $1.
child_pids() {
	local parent=$1 p stat rest
	for p in /proc/[0-9]*; do
		stat=$(cat "$p/stat" 2>/dev/null) || continue
		rest=${stat##*) }       # "<state> <ppid> ..." after the command name
		rest=${rest#* }
		[ "${rest%% *}" = "$parent" ] && echo "${p#/proc/}"
	done
	return 0
}

cmd_stop() {
	[ $# = 1 ] || die "usage: stop <workdir>"
	[ -d "$1" ] || return 0
	local w pid t m
	w=$(cd "$1" && pwd)
	if daemon_pid "$w" >/dev/null; then
		# Kill every task so nothing outlives the daemon.
		for t in $(ctr_ "$w" -n k8s.io tasks ls -q 2>/dev/null); do
			ctr_ "$w" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
		done
	fi
	stop_daemon "$w"
	# Shims left behind, as after kill-daemon: kill their children first
	# (each container's init, whose death ends its PID namespace), then them.
	local shims
	shims=$(shim_pids "$w")
	for pid in $shims; do
		for child in $(child_pids "$pid"); do
			kill -KILL "$child" 2>/dev/null || true
		done
		kill -KILL "$pid" 2>/dev/null || true
	done
	# Unmount everything under the workdir, deepest first.
	for m in $(awk -v w="$w/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
	done
	log "containerd in $w stopped"
}

case "${1:-}" in
setup) shift; cmd_setup "$@" ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
kill-daemon) shift; cmd_kill_daemon "$@" ;;
*) die "usage: $0 setup [2.4.2|1.7.35] | start <version> <workdir> | stop <workdir> | kill-daemon <workdir>" ;;
esac
