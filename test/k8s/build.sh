#!/usr/bin/env bash
# build.sh builds the single-node cluster's binaries from the Go module proxy,
# no container registry and no release download: etcd from
# go.etcd.io/etcd/server/v3 and kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kubectl from k8s.io/kubernetes. They are cached
# under ${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}/{etcd-<v>,k8s-<v>}/bin;
# a second run finds them there and does nothing.
#
#   bash test/k8s/build.sh
#
# Both modules' go.mod replace sibling modules with relative paths that their
# module zips lack (etcd's ../api and friends; Kubernetes' ./staging/src/...),
# so neither `go install pkg@version` nor a plain build inside the module
# works. Each is built inside its (read-only) module directory with a copy of
# its go.mod given to -modfile: for etcd without the replace block, for
# Kubernetes with each staging module required at its published v0.<minor>
# version instead. GOWORK=off keeps Kubernetes' go.work out of it.
set -euo pipefail

cache=${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}
etcd_version=3.7.3
k8s_version=1.37.2
# The staging modules (k8s.io/api, k8s.io/client-go, ...) are published as
# v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>.
staging_version=v0.${k8s_version#1.}
k8s_commands="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"

die() { echo "build.sh: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

command -v go >/dev/null || die "go is not installed"

# module_dir downloads module@version through the proxy and prints its
# directory in the module cache.
module_dir() {
	local dir
	dir=$(cd / && GOFLAGS= GOWORK=off go mod download -json "$1" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] && [ -d "$dir" ] || die "go mod download $1 gave no source directory"
	echo "$dir"
}

# go_build <module dir> <modfile> <out dir> <ldflags> <packages...>
go_build() {
	local src=$1 modfile=$2 out=$3 ldflags=$4
	shift 4
	(cd "$src" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local \
		go build -modfile="$modfile" -trimpath -ldflags "$ldflags" -o "$out/" "$@")
}

build_etcd() {
	local bin=$cache/etcd-$etcd_version/bin tmp src
	if [ -x "$bin/etcd" ]; then
		log "etcd $etcd_version: cached in $bin"
		return
	fi
	mkdir -p "$cache/etcd-$etcd_version"
	tmp=$(mktemp -d "$cache/etcd-$etcd_version/build.XXXXXX")
	src=$(module_dir "go.etcd.io/etcd/server/v3@v$etcd_version")
	log "etcd $etcd_version: building from $src"
	# The go.mod without its replace block, and the go.sum beside it.
	awk '/^replace \($/ { skip = 1; next } skip && /^\)$/ { skip = 0; next } !skip && !/^replace / { print }' \
		"$src/go.mod" >"$tmp/go.mod"
	cp "$src/go.sum" "$tmp/go.sum"
	mkdir -p "$tmp/out"
	# -o names the file: the main package's directory is called "v3".
	(cd "$src" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local \
		go build -modfile="$tmp/go.mod" -trimpath -ldflags "-s -w" -o "$tmp/out/etcd" .)
	[ -x "$tmp/out/etcd" ] || die "etcd $etcd_version: no etcd binary in $tmp/out"
	"$tmp/out/etcd" --version >&2
	mkdir -p "$bin"
	mv -f "$tmp/out/etcd" "$bin/etcd"
	rm -rf "$tmp"
}

build_k8s() {
	local bin=$cache/k8s-$k8s_version/bin tmp src c missing=0 staging
	for c in $k8s_commands; do [ -x "$bin/$c" ] || missing=1; done
	if [ "$missing" = 0 ]; then
		log "kubernetes $k8s_version: cached in $bin"
		return
	fi
	mkdir -p "$cache/k8s-$k8s_version"
	tmp=$(mktemp -d "$cache/k8s-$k8s_version/build.XXXXXX")
	src=$(module_dir "k8s.io/kubernetes@v$k8s_version")
	log "kubernetes $k8s_version: building from $src (about 6 minutes and 4 GB of build cache when cold)"
	cp "$src/go.mod" "$tmp/go.mod"
	cp "$src/go.sum" "$tmp/go.sum"
	# Every replace that points into ./staging becomes a requirement on the
	# published module.
	staging=$(GOFLAGS= go mod edit -json "$tmp/go.mod" |
		awk '/"Old": \{/ { old = 1; next }
			old && /"Path":/ { gsub(/[",]/, "", $2); path = $2; old = 0; next }
			/"New": \{/ { new = 1; next }
			new && /"Path":/ { gsub(/[",]/, "", $2); if ($2 ~ /^\.\/staging\//) print path; new = 0 }')
	[ -n "$staging" ] || die "kubernetes $k8s_version: found no staging replaces in its go.mod"
	local edits=()
	for m in $staging; do
		edits+=("-dropreplace=$m" "-require=$m@$staging_version")
	done
	GOFLAGS= go mod edit "${edits[@]}" "$tmp/go.mod"
	if grep -q '=> \./' "$tmp/go.mod"; then
		die "kubernetes $k8s_version: relative replaces left in the go.mod copy: $(grep '=> \./' "$tmp/go.mod")"
	fi
	local minor=${k8s_version#1.}
	minor=${minor%%.*}
	local v=k8s.io/component-base/version
	local ldflags="-s -w -X $v.gitVersion=v$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
	ldflags="$ldflags -X $v.buildDate=1970-01-01T00:00:00Z"
	mkdir -p "$tmp/out"
	local pkgs=()
	for c in $k8s_commands; do pkgs+=("./cmd/$c"); done
	go_build "$src" "$tmp/go.mod" "$tmp/out" "$ldflags" "${pkgs[@]}"
	mkdir -p "$bin"
	for c in $k8s_commands; do
		[ -x "$tmp/out/$c" ] || die "kubernetes $k8s_version: $c was not built"
		mv -f "$tmp/out/$c" "$bin/$c"
	done
	rm -rf "$tmp"
	"$bin/kubelet" --version >&2
}

build_etcd
build_k8s
