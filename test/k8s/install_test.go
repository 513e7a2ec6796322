//go:build k8s

package k8s

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	corev1 "k8s.io/api/core/v1"
)

const (
	namespace = "pleg-bridge"
	// dataDir is the DaemonSet's hostPath for the checkpoint, on this node.
	dataDir = "/var/lib/pleg-bridge"
	// podSelector selects the bridge's pods, as the manifests label them.
	podSelector = "app.kubernetes.io/name=pleg-bridge"
)

// monitoringCRDs are stand-ins for the Prometheus Operator's PodMonitor and
// PrometheusRule definitions, which the component
// deploy/kubernetes/components/prometheus-operator and the chart's
// podMonitor and prometheusRule need: a cluster with the operator has them.
// The installations run without them, as on a cluster without the operator.
const monitoringCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: podmonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PodMonitor, plural: podmonitors, singular: podmonitor, listKind: PodMonitorList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PrometheusRule, plural: prometheusrules, singular: prometheusrule, listKind: PrometheusRuleList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// installer installs pleg-bridge as docs/deployment.md says, with what a
// user changes (the image and its pull policy, the socket, the NATS
// Secret), and removes it again.
type installer struct {
	name           string
	churnNamespace string   // of the pods the test creates
	auth           natsAuth // the credential the bridge is given
	install        func(t *testing.T, nats *hostNATS)
	uninstall      func(t *testing.T)
}

// createNamespaceAndSecret creates the namespace from
// deploy/kubernetes/namespace.yaml and the Secret pleg-bridge-nats with the
// URL and the credential, as docs/deployment.md does, and fails the test if
// kubectl warns.
func createNamespaceAndSecret(t *testing.T, nats *hostNATS) {
	t.Helper()
	kubectlQuiet(t, nil, "apply", "-f", filepath.Join(suite.repo, "deploy", "kubernetes", "namespace.yaml"))
	dir := t.TempDir()
	args := []string{"-n", namespace, "create", "secret", "generic", "pleg-bridge-nats", "--from-literal=url=" + nats.URL}
	for key, content := range map[string][]byte{"nats.creds": nats.Creds, "nkey.seed": nats.NKeySeed} {
		if content == nil {
			continue
		}
		path := filepath.Join(dir, key)
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--from-file="+key+"="+path)
	}
	kubectlQuiet(t, nil, args...)
}

// imageRepoTag splits the image reference image, repository:tag.
func imageRepoTag(t *testing.T, image string) (string, string) {
	t.Helper()
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		t.Fatalf("image %q has no tag", image)
	}
	return image[:i], image[i+1:]
}

// kustomizeInstaller applies an overlay of deploy/kubernetes, as it is,
// without the Prometheus Operator's component: the image, pull policy
// Never (it is imported, not pulled), and the node's socket path in the
// hostPath only, as docs/deployment.md says (JSON patches that check what
// they replace). The namespace and the Secret (the node's own credentials,
// made by pleg-bridge creds, and no other NATS setting) come first, as
// docs/deployment.md says. Neither apply may print a warning.
func kustomizeInstaller() installer {
	var overlay string
	return installer{
		name:           "kubectl apply -k",
		churnNamespace: "churn-kustomize",
		auth:           authNodeCreds,
		install: func(t *testing.T, nats *hostNATS) {
			overlay = t.TempDir()
			base, err := filepath.Rel(overlay, filepath.Join(suite.repo, "deploy", "kubernetes"))
			if err != nil {
				t.Fatal(err)
			}
			repo, tag := imageRepoTag(t, suite.image)
			sock := suite.socket
			kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - name: ghcr.io/pleg-bridge/pleg-bridge
    newName: %s
    newTag: %q
patches:
  - target: {kind: DaemonSet, name: pleg-bridge}
    patch: |
      - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}
      - {op: test, path: /spec/template/spec/volumes/0/name, value: cri-socket}
      - {op: replace, path: /spec/template/spec/volumes/0/hostPath/path, value: %q}
`, base, repo, tag, sock)
			if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o600); err != nil {
				t.Fatal(err)
			}
			createNamespaceAndSecret(t, nats)
			kubectlQuiet(t, nil, "apply", "-k", overlay)
		},
		uninstall: func(t *testing.T) {
			// The namespace goes, and the Secret with it.
			kubectl(t, nil, "delete", "-k", overlay, "--wait", "--timeout=120s")
		},
	}
}

// helmInstaller installs the chart with --set for the same things, the
// credential an NKey seed, into the namespace of namespace.yaml holding the
// Secret the user created.
func helmInstaller() installer {
	return installer{
		name:           "helm install",
		churnNamespace: "churn-helm",
		auth:           authNKey,
		install: func(t *testing.T, nats *hostNATS) {
			createNamespaceAndSecret(t, nats)
			repo, tag := imageRepoTag(t, suite.image)
			registry, repository, _ := strings.Cut(repo, "/")
			_, stderr, err := runOutput(nil, suite.helm, "install", "pleg-bridge",
				filepath.Join(suite.repo, "deploy", "helm", "pleg-bridge"), "--namespace", namespace,
				"--set", "image.registry="+registry, "--set", "image.repository="+repository,
				"--set-string", "image.tag="+tag, "--set", "image.pullPolicy=Never",
				"--set", "criSocket="+suite.socket,
				"--set", "nats.credsKey=", "--set", "nats.nkeySeedKey=nkey.seed")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(stderr), "PodSecurity") {
				t.Errorf("helm install printed a Pod Security warning:\n%s", stderr)
			}
		},
		uninstall: func(t *testing.T) {
			if _, err := run(nil, suite.helm, "uninstall", "pleg-bridge", "--namespace", namespace, "--wait"); err != nil {
				t.Error(err)
			}
			kubectl(t, nil, "delete", "namespace", namespace, "--wait", "--timeout=120s")
		},
	}
}

// bridgePods returns the bridge's pods.
func bridgePods(t *testing.T) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := json.Unmarshal(kubectl(t, nil, "-n", namespace, "get", "pods", "-l", podSelector, "-o", "json"), &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitBridgeReady waits for the one bridge pod on the node, other than
// the pod UID not, to be Ready: its readinessProbe is GET /readyz, which
// needs the CRI runtime relisted and NATS connected with the stream. It
// returns the pod.
func waitBridgeReady(t *testing.T, not string) corev1.Pod {
	t.Helper()
	var ready corev1.Pod
	waittest.Until(t, 2*time.Minute, "the bridge's pod Ready", func() (bool, error) {
		pods := bridgePods(t)
		for _, p := range pods {
			if string(p.UID) != not && p.DeletionTimestamp == nil && podReady(p) {
				ready = p
				return true, nil
			}
		}
		return false, fmt.Errorf("pods %v", podSummary(pods))
	})
	return ready
}

func podSummary(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		s := fmt.Sprintf("%s %s ready=%v", p.Name, p.Status.Phase, podReady(p))
		for _, c := range p.Status.ContainerStatuses {
			s += fmt.Sprintf(" restarts=%d state=%+v", c.RestartCount, c.State)
		}
		out = append(out, s)
	}
	return out
}

// checkRunsAsWritten checks the bridge's process on the node: the
// manifests' security context, applied unchanged by the kubelet and runc:
// UID 0 with no capability at all, no_new_privs, a read-only root and the
// socket mounted read-only.
func checkRunsAsWritten(t *testing.T, pod corev1.Pod) {
	t.Helper()
	if len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("the bridge's pod has %d containers", len(pod.Status.ContainerStatuses))
	}
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := run(nil, suite.ctr, "--address", suite.socket, "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	pid := ""
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid = f[1]
		}
	}
	if pid == "" {
		t.Fatalf("no task for the bridge's container %s in:\n%s", id, out)
	}
	status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields[k] = strings.TrimSpace(v)
	}
	for k, want := range map[string]string{
		"Uid": "0\t0\t0\t0", "Gid": "0\t0\t0\t0",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2",
	} {
		if fields[k] != want {
			t.Errorf("the bridge's process (pid %s): %s %q, want %q", pid, k, fields[k], want)
		}
	}
	mounts, err := os.ReadFile(filepath.Join("/proc", pid, "mounts"))
	if err != nil {
		t.Fatal(err)
	}
	options := map[string][]string{}
	for line := range strings.Lines(string(mounts)) {
		if f := strings.Fields(line); len(f) >= 4 {
			options[f[1]] = strings.Split(f[3], ",")
		}
	}
	// The socket where the container sees it: the node's path (the chart)
	// or the base's, whose hostPath alone points at the node's (kustomize).
	socket := ""
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.Name == "cri-socket" {
			socket = m.MountPath
		}
	}
	for _, path := range []string{"/", socket, "/etc/pleg-bridge/nats"} {
		if !slices.Contains(options[path], "ro") {
			t.Errorf("%s is mounted %v in the bridge's container, want read-only", path, options[path])
		}
	}
	if opts, ok := options[dataDir]; !ok || !slices.Contains(opts, "rw") {
		t.Errorf("%s is mounted %v in the bridge's container, want read-write", dataDir, opts)
	}
}

// bridgeLogs prints the logs of the bridge's containers, the previous ones
// included, for a failed test.
func bridgeLogs(t *testing.T) {
	t.Helper()
	for _, p := range bridgePods(t) {
		for _, prev := range []string{"--previous=false", "--previous=true"} {
			out, err := run(nil, suite.kubectl, "-n", namespace, "logs", p.Name, prev, "--tail=40")
			if err == nil && len(out) > 0 {
				t.Logf("logs of %s (%s):\n%s", p.Name, prev, out)
			}
		}
	}
}

// cleanDataDir removes the checkpoint the bridge left on the node, so that
// the next installation starts as on a new node. It refuses a directory it
// did not expect.
func cleanDataDir(t *testing.T) {
	t.Helper()
	entries, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}
