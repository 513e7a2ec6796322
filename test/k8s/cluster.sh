#!/usr/bin/env bash
# cluster.sh sets up, starts and stops a single-node Kubernetes cluster for
# pleg-bridge's node tests, offline: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and a kubelet on the end-to-end
# tests' containerd 2.4.2, everything on loopback but the pod network (a CNI
# bridge) and nothing pulled from a registry. There is no kube-proxy (it
# would rewrite the machine's NAT rules), so ClusterIP services are not
# routed; nothing here needs them.
#
#   cluster.sh setup              build or find every binary (test/k8s/build.sh,
#                                 test/e2e/containerd.sh setup 2.4.2), install
#                                 Debian's CNI plugins if missing
#   cluster.sh start <workdir>    record the machine's state, start the cluster
#                                 in <workdir>, wait for the node to be Ready;
#                                 writes <workdir>/env (KUBECONFIG, ...)
#   cluster.sh stop <workdir>     stop everything, and put back what the
#                                 kubelet and the CNI plugin changed (sysctls,
#                                 iptables chains, cgroups, the bridge, the
#                                 directories they created); fails if the
#                                 machine is not as it was
#
# Needs root and Linux. Logs are in <workdir>/logs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${PLEG_E2E_CACHE:-/var/cache/pleg-bridge-e2e}
k8s_bin=$cache/k8s-1.37.2/bin
etcd_bin=$cache/etcd-3.7.3/bin
containerd_version=2.4.2
containerd_bin=$cache/$containerd_version/bin
cni_bin=/usr/lib/cni
pause_image=localhost/pleg-e2e/pause:1

node_name=pleg-e2e-node
bridge=plegk8s0
pod_cidr=10.244.77.0/24
service_cidr=10.96.77.0/24
etcd_port=12379
etcd_peer_port=12380
api_port=6443
# Ports the cluster listens on; start fails if one is taken.
ports="$etcd_port $etcd_peer_port $api_port 10250 10248 10257 10259"
# What the kubelet and the CNI bridge plugin change on the machine.
sysctls="vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
# Directories the kubelet, containerd's CNI library or the bridge's hostPath
# create outside the workdir when missing: removed at stop if they were.
host_dirs="/var/log/containers /var/log/pods /var/lib/cni /var/lib/kubelet /var/lib/pleg-bridge /run/netns /etc/kubernetes"

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

need_root() {
	[ "$(id -u)" = 0 ] || die "needs root"
	[ "$(uname -s)" = Linux ] || die "needs Linux"
}

cmd_setup() {
	need_root
	bash "$here/build.sh"
	bash "$repo/test/e2e/containerd.sh" setup "$containerd_version"
	if [ ! -x "$cni_bin/bridge" ] || [ ! -x "$cni_bin/host-local" ] || [ ! -x "$cni_bin/loopback" ]; then
		command -v apt-get >/dev/null || die "the CNI plugins are missing from $cni_bin and apt-get is not available"
		log "installing Debian's containernetworking-plugins"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containernetworking-plugins >&2
	fi
	[ -x "$cni_bin/bridge" ] || die "no CNI bridge plugin in $cni_bin after installing containernetworking-plugins"
	command -v openssl >/dev/null || die "openssl is needed for the cluster's certificates"
	command -v curl >/dev/null || die "curl is needed to wait for the cluster"
}

# --- the machine's state, before and after ---

iptables_cmds() {
	local c
	for c in iptables ip6tables; do
		command -v "$c-save" >/dev/null && echo "$c"
	done
	return 0
}

# chains prints "<table> <chain>" for every user-defined chain of iptables
# command $1 (built-in chains, which appear with their table, have a policy).
chains() {
	"$1-save" 2>/dev/null | awk '/^\*/ { table = substr($0, 2) } /^:/ && $2 == "-" { print table, substr($1, 2) }' | sort
}

# rules prints every rule of iptables command $1, with its table.
rules() {
	"$1-save" 2>/dev/null | awk '/^\*/ { table = substr($0, 2) } /^-A / { print table, $0 }' | sort
}

# nft_tables prints the nftables tables (iptables-nft makes one per
# iptables table the kubelet touches).
nft_tables() {
	command -v nft >/dev/null || return 0
	nft list tables 2>/dev/null | sort
}

cgroup_dirs() { find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name 'kubepods*' 2>/dev/null | sort; }

record_state() {
	local w=$1 s c d
	mkdir -p "$w/host"
	for s in $sysctls; do
		[ -e "/proc/sys/${s//./\/}" ] && echo "$s $(sysctl -n "$s")"
	done >"$w/host/sysctls"
	for d in $host_dirs; do
		[ -e "$d" ] && echo "$d"
	done >"$w/host/dirs"
	for c in $(iptables_cmds); do
		chains "$c" >"$w/host/$c.chains"
		rules "$c" >"$w/host/$c.rules"
	done
	nft_tables >"$w/host/nft.tables"
	cgroup_dirs >"$w/host/cgroups"
}

# restore_state puts back what the cluster changed and checks the result;
# it returns non-zero, after trying everything, if something is left.
restore_state() {
	local w=$1 s v now d c t chain rest bad=0
	[ -d "$w/host" ] || return 0
	while read -r s v; do
		now=$(sysctl -n "$s")
		if [ "$now" != "$v" ]; then
			log "restoring sysctl $s: $now -> $v"
			sysctl -q -w "$s=$v" >/dev/null || { log "cannot restore sysctl $s"; bad=1; }
		fi
	done <"$w/host/sysctls"
	for d in $host_dirs; do
		if [ -e "$d" ] && ! grep -qx "$d" "$w/host/dirs"; then
			umount_under "$d"
			rm -rf "$d" || { log "cannot remove $d"; bad=1; }
		fi
	done
	for c in $(iptables_cmds); do
		[ -f "$w/host/$c.chains" ] || continue
		# New chains: first the rules that jump to them, then the chains.
		comm -13 "$w/host/$c.chains" <(chains "$c") >"$w/host/$c.new"
		while read -r t chain; do
			"$c-save" -t "$t" | grep -E "^-A .* -j $chain( |\$)" | while read -r _ rest; do
				# eval: iptables-save quotes comments ("kubernetes ...").
				eval "\"\$c\" -t \"\$t\" -D $rest" 2>/dev/null || true
			done
		done <"$w/host/$c.new"
		while read -r t chain; do
			"$c" -t "$t" -F "$chain" 2>/dev/null || true
		done <"$w/host/$c.new"
		while read -r t chain; do
			"$c" -t "$t" -X "$chain" 2>/dev/null || { log "cannot delete $c chain $t/$chain"; bad=1; }
		done <"$w/host/$c.new"
		if ! diff -q "$w/host/$c.chains" <(chains "$c") >/dev/null || ! diff -q "$w/host/$c.rules" <(rules "$c") >/dev/null; then
			log "$c differs from before: $(diff "$w/host/$c.chains" <(chains "$c") | tr '\n' ' ') $(diff "$w/host/$c.rules" <(rules "$c") | tr '\n' ' ')"
			bad=1
		fi
	done
	# Tables iptables-nft created for the kubelet, now empty.
	if [ -f "$w/host/nft.tables" ]; then
		comm -13 "$w/host/nft.tables" <(nft_tables) | while read -r _ family table; do
			nft delete table "$family" "$table" || log "cannot delete nftables table $family $table"
		done
		if ! diff -q "$w/host/nft.tables" <(nft_tables) >/dev/null; then
			log "nftables tables differ from before: $(diff "$w/host/nft.tables" <(nft_tables) | tr '\n' ' ')"
			bad=1
		fi
	fi
	for d in $(comm -13 "$w/host/cgroups" <(cgroup_dirs)); do
		# Deepest first; rmdir only, which fails on a cgroup still in use.
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
		[ -e "$d" ] && { log "cannot remove cgroup $d"; bad=1; }
	done
	if ip link show "$bridge" >/dev/null 2>&1; then
		ip link delete "$bridge" || { log "cannot delete the bridge $bridge"; bad=1; }
	fi
	return "$bad"
}

# umount_under unmounts every mount point at or under $1, deepest first.
umount_under() {
	local m
	for m in $(awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
	done
}

# --- certificates ---

# cert <dir> <name> <subject> [<subjectAltName>]: a key and a certificate
# signed by the cluster's CA.
cert() {
	local d=$1 n=$2 subj=$3 san=${4:-} ext
	openssl ecparam -name prime256v1 -genkey -noout -out "$d/$n.key" 2>/dev/null
	openssl req -new -key "$d/$n.key" -subj "$subj" -out "$d/$n.csr" 2>/dev/null
	ext="keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth"
	[ -n "$san" ] && ext="$ext
subjectAltName=$san"
	openssl x509 -req -in "$d/$n.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
		-days 2 -sha256 -extfile <(echo "$ext") -out "$d/$n.crt" 2>/dev/null
	rm -f "$d/$n.csr"
}

kubeconfig() {
	local d=$1 n=$2
	cat >"$d/$n.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: pleg-e2e
    cluster:
      server: https://127.0.0.1:$api_port
      certificate-authority: $d/ca.crt
users:
  - name: $n
    user:
      client-certificate: $d/$n.crt
      client-key: $d/$n.key
contexts:
  - name: pleg-e2e
    context: {cluster: pleg-e2e, user: $n}
current-context: pleg-e2e
EOF
}

make_pki() {
	local d=$1 node_ip=$2
	mkdir -p "$d"
	openssl ecparam -name prime256v1 -genkey -noout -out "$d/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$d/ca.key" -subj "/CN=pleg-e2e-ca" -days 2 -sha256 -out "$d/ca.crt" 2>/dev/null
	cert "$d" apiserver "/CN=kube-apiserver" \
		"IP:127.0.0.1,IP:$node_ip,IP:${service_cidr%.*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
	cert "$d" admin "/O=system:masters/CN=pleg-e2e-admin"
	cert "$d" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
	cert "$d" controller-manager "/CN=system:kube-controller-manager"
	cert "$d" scheduler "/CN=system:kube-scheduler"
	cert "$d" kubelet "/O=system:nodes/CN=system:node:$node_name" "IP:127.0.0.1,IP:$node_ip,DNS:$node_name"
	openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
	openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
	for n in admin controller-manager scheduler kubelet; do kubeconfig "$d" "$n"; done
}

# --- processes ---

# run_bg <workdir> <name> <command...>: start a daemon in its own session,
# logging to <workdir>/logs/<name>.log, its pid in <workdir>/pids/<name>.
run_bg() {
	local w=$1 n=$2
	shift 2
	mkdir -p "$w/logs" "$w/pids"
	setsid "$@" >>"$w/logs/$n.log" 2>&1 </dev/null &
	echo $! >"$w/pids/$n"
}

alive() { [ -f "$1/pids/$2" ] && kill -0 "$(cat "$1/pids/$2")" 2>/dev/null; }

# wait_for <workdir> <name> <seconds> <what> <command...>: run the command
# until it succeeds; fail if the daemon <name> dies or time runs out.
wait_for() {
	local w=$1 n=$2 secs=$3 what=$4 deadline
	shift 4
	deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if ! alive "$w" "$n"; then
			tail -n 40 "$w/logs/$n.log" >&2 || true
			die "$n exited while waiting for $what (log: $w/logs/$n.log)"
		fi
		if [ "$SECONDS" -ge "$deadline" ]; then
			tail -n 40 "$w/logs/$n.log" >&2 || true
			die "$what: not within ${secs}s (log: $w/logs/$n.log)"
		fi
		sleep 0.2
	done
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

api_ok() {
	curl -fsS --cacert "$1/pki/ca.crt" --cert "$1/pki/admin.crt" --key "$1/pki/admin.key" \
		"https://127.0.0.1:$api_port$2"
}

write_containerd_config() {
	local w=$1
	# Keys checked against containerd v2.4.2's docs/cri/config.md. The
	# network namespaces are mounted under the state directory, inside the
	# workdir, and the CNI configuration is the workdir's.
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
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$cni_bin"]
    conf_dir = "$w/cni"
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$w/runc"
        SystemdCgroup = false
EOF
	mkdir -p "$w/cni"
	# The bridge plugin's default route lets pods reach the node's address
	# (where the tests' NATS listens); host-local keeps its leases in the
	# workdir. No IP masquerade: nothing leaves the node.
	cat >"$w/cni/10-pleg-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "pleg-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$w/cni-ipam",
        "ranges": [[{"subnet": "$pod_cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
}

write_kubelet_config() {
	local w=$1
	cat >"$w/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$w/containerd.sock
podLogsDir: $w/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $w/pki/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $w/pki/kubelet.crt
tlsPrivateKeyFile: $w/pki/kubelet.key
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# The images are imported, not pulled: they must never be collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 87600h
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
# Crash loops restart within a second, not after 10s, 20s, 40s...
crashLoopBackOff:
  maxContainerRestartPeriod: 1s
resolvConf: /etc/resolv.conf
serializeImagePulls: false
EOF
}

cmd_start() {
	[ $# = 1 ] || die "usage: start <workdir>"
	need_root
	local w node_ip p
	mkdir -p "$1"
	w=$(cd "$1" && pwd)
	[ ${#w} -le 60 ] || die "workdir path too long for the unix sockets under it: $w"
	for b in "$k8s_bin/kube-apiserver" "$k8s_bin/kubelet" "$k8s_bin/kubectl" "$etcd_bin/etcd" \
		"$containerd_bin/containerd" "$cni_bin/bridge"; do
		[ -x "$b" ] || die "$b is missing: run '$0 setup' first"
	done
	[ -s "$cache/images/images.tar" ] || die "the test images are missing: run '$0 setup' first"
	for p in $ports; do
		port_free "$p" || die "port $p is in use: is another cluster running?"
	done
	[ -z "$(cgroup_dirs)" ] || die "kubepods cgroups exist already ($(cgroup_dirs | tr '\n' ' ')): is another kubelet running?"
	! ip link show "$bridge" >/dev/null 2>&1 || die "the bridge $bridge exists already: is another cluster running?"
	node_ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
	[ -n "$node_ip" ] || die "cannot find the node's IPv4 address (ip route get 1.1.1.1)"

	record_state "$w"
	make_pki "$w/pki" "$node_ip"

	log "etcd"
	run_bg "$w" etcd "$etcd_bin/etcd" --name default --data-dir "$w/etcd" \
		--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
		--listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
		--initial-cluster "default=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync --log-level warn
	wait_for "$w" etcd 30 "etcd health" curl -fsS "http://127.0.0.1:$etcd_port/health"

	log "kube-apiserver"
	run_bg "$w" kube-apiserver "$k8s_bin/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$etcd_port" \
		--bind-address 127.0.0.1 --secure-port "$api_port" --advertise-address "$node_ip" \
		--tls-cert-file "$w/pki/apiserver.crt" --tls-private-key-file "$w/pki/apiserver.key" \
		--client-ca-file "$w/pki/ca.crt" \
		--kubelet-client-certificate "$w/pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$w/pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types InternalIP,Hostname \
		--service-account-issuer https://kubernetes.default.svc \
		--service-account-key-file "$w/pki/sa.pub" --service-account-signing-key-file "$w/pki/sa.key" \
		--service-cluster-ip-range "$service_cidr" \
		--authorization-mode Node,RBAC --endpoint-reconciler-type none
	wait_for "$w" kube-apiserver 60 "kube-apiserver readiness" api_ok "$w" /readyz

	log "kube-controller-manager, kube-scheduler"
	run_bg "$w" kube-controller-manager "$k8s_bin/kube-controller-manager" \
		--kubeconfig "$w/pki/controller-manager.kubeconfig" --leader-elect=false \
		--use-service-account-credentials \
		--bind-address 127.0.0.1 \
		--service-account-private-key-file "$w/pki/sa.key" --root-ca-file "$w/pki/ca.crt" \
		--cluster-cidr "$pod_cidr" --service-cluster-ip-range "$service_cidr"
	run_bg "$w" kube-scheduler "$k8s_bin/kube-scheduler" \
		--kubeconfig "$w/pki/scheduler.kubeconfig" --leader-elect=false --bind-address 127.0.0.1

	log "containerd $containerd_version"
	write_containerd_config "$w"
	echo "$containerd_version" >"$w/version"
	PATH="$containerd_bin:$PATH" setsid "$containerd_bin/containerd" --config "$w/config.toml" \
		>>"$w/containerd.log" 2>&1 </dev/null &
	echo $! >"$w/containerd.pid"
	mkdir -p "$w/pids" && cp "$w/containerd.pid" "$w/pids/containerd"
	mkdir -p "$w/logs" && ln -sf ../containerd.log "$w/logs/containerd.log"
	wait_for "$w" containerd 60 "containerd" "$containerd_bin/ctr" --address "$w/containerd.sock" --timeout 2s version
	"$containerd_bin/ctr" --address "$w/containerd.sock" -n k8s.io images import "$cache/images/images.tar" >/dev/null ||
		die "import of the test images failed"

	log "kubelet"
	write_kubelet_config "$w"
	run_bg "$w" kubelet "$k8s_bin/kubelet" --config "$w/kubelet.yaml" \
		--kubeconfig "$w/pki/kubelet.kubeconfig" --root-dir "$w/kubelet" \
		--hostname-override "$node_name" --node-ip "$node_ip"
	cat >"$w/env" <<EOF
export KUBECONFIG=$w/pki/admin.kubeconfig
export PLEG_K8S_KUBECTL=$k8s_bin/kubectl
export PLEG_K8S_CTR=$containerd_bin/ctr
export PLEG_K8S_NODE=$node_name
export PLEG_K8S_NODE_IP=$node_ip
export PLEG_K8S_CONTAINERD_SOCKET=$w/containerd.sock
export PLEG_K8S_WORKDIR=$w
EOF
	wait_for "$w" kubelet 90 "node $node_name Ready" \
		"$k8s_bin/kubectl" --kubeconfig "$w/pki/admin.kubeconfig" wait --for=condition=Ready "node/$node_name" --timeout=2s
	wait_for "$w" kube-controller-manager 60 "the default service account" \
		"$k8s_bin/kubectl" --kubeconfig "$w/pki/admin.kubeconfig" -n default get serviceaccount default
	alive "$w" kube-scheduler || die "kube-scheduler exited (log: $w/logs/kube-scheduler.log)"
	log "node $node_name Ready; KUBECONFIG=$w/pki/admin.kubeconfig (source $w/env)"
}

# stop_pids <workdir> <seconds> <name>...: SIGTERM to the daemons, all at
# once, then SIGKILL to those still running after <seconds>; returns once
# all have exited.
stop_pids() {
	local w=$1 grace=$2 n pid i pids=()
	shift 2
	for n in "$@"; do
		[ -f "$w/pids/$n" ] || continue
		pid=$(cat "$w/pids/$n")
		kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
		rm -f "$w/pids/$n"
	done
	for pid in "${pids[@]}"; do
		for i in $(seq 1 $((grace * 10))); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		for i in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	done
	return 0
}

cmd_stop() {
	[ $# = 1 ] || die "usage: stop <workdir>"
	[ -d "$1" ] || return 0
	need_root
	local w bad=0 p
	w=$(cd "$1" && pwd)
	# The kubelet first, so that it restarts nothing; then every container
	# with containerd (test/e2e/containerd.sh stop kills the tasks, the
	# shims and unmounts everything under the workdir); then the control
	# plane.
	stop_pids "$w" 10 kubelet
	bash "$repo/test/e2e/containerd.sh" stop "$w" || bad=1
	rm -f "$w/pids/containerd"
	# The control plane keeps nothing worth a graceful stop (the
	# controller-manager takes 7 s to stop on SIGTERM): 2 s each at most.
	stop_pids "$w" 2 kube-scheduler kube-controller-manager kube-apiserver
	stop_pids "$w" 10 etcd
	umount_under "$w"
	restore_state "$w" || bad=1
	# Anything still running from the workdir is a leak.
	local left=()
	for p in /proc/[0-9]*; do
		[ "${p#/proc/}" = $$ ] && continue
		case "$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" in
		*"$w/"*) left+=("${p#/proc/}") ;;
		esac
	done
	if [ ${#left[@]} != 0 ]; then
		log "processes still running from $w: ${left[*]}; killing them"
		kill -KILL "${left[@]}" 2>/dev/null || true
		bad=1
	fi
	if awk -v w="$w" 'index($2, w) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
		log "mounts left under $w"
		bad=1
	fi
	[ "$bad" = 0 ] || die "the machine is not as it was before the cluster started (see above)"
	log "cluster in $w stopped; the machine is as it was"
}

case "${1:-}" in
setup) shift; cmd_setup "$@" ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
*) die "usage: $0 setup | start <workdir> | stop <workdir>" ;;
esac
