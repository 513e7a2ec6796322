package main

// The Helm chart (deploy/helm/pleg-bridge) against deploy/kubernetes and the
// code: helm lint, helm template with default and other values, every
// rendered object decoded strictly, the default rendering compared with
// what `kubectl apply -k deploy/kubernetes` applies (and with the
// monitoring objects on, with the overlay adding the Prometheus Operator's
// component), the values the schema refuses, and for every kind of NATS
// credential the bridge run with the rendered container's environment and
// Secret files against a server that requires it. test/k8s installs both
// on a real node.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/natsauth/natsauthtest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// helmOnlyLabels are the labels the chart adds to what deploy/kubernetes
// has: Helm's conventional ones. They are the only difference allowed.
var helmOnlyLabels = []string{"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"}

// helm returns the path of helm. Without it the test is skipped on a
// developer's machine, and fails where CI is set (.ci/run builds helm from
// the Go module proxy).
func helm(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("helm")
	if err == nil {
		return path
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "false" {
		t.Fatalf("helm not found with CI=%s: %v (.ci/run builds it: go install helm.sh/helm/v3/cmd/helm@v3.22.0)", ci, err)
	}
	t.Skipf("helm not found (%v); go install helm.sh/helm/v3/cmd/helm@v3.22.0, and with CI set this fails", err)
	return ""
}

func chartDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(repoRoot(t), "deploy", "helm", "pleg-bridge")
}

// runHelm runs helm with args and returns its standard output, or its
// error with the standard error.
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), helm(t), args...)
	// No user configuration or repositories: the chart has no dependencies.
	dir := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+dir, "HELM_CACHE_HOME="+dir, "HELM_DATA_HOME="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// helmTemplate renders the chart as release pleg-bridge in namespace
// pleg-bridge with the given values files, and fails the test if helm
// refuses.
func helmTemplate(t *testing.T, valuesFiles ...string) []byte {
	t.Helper()
	args := []string{"template", "pleg-bridge", chartDir(t), "--namespace", "pleg-bridge"}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeValues writes a values file and returns its path.
func writeValues(t *testing.T, values string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// splitYAML splits a multi-document stream into its non-empty documents.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), b...), []byte("\n---")) {
		empty := true
		for line := range strings.Lines(string(d)) {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

// decodeRendered decodes every rendered object strictly into the type of
// its kind, keyed "Kind/name", and checks its apiVersion and namespace.
func decodeRendered(t *testing.T, b []byte) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, doc := range splitYAML(b) {
		var tm struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("rendered document does not parse: %v\n%s", err, doc)
		}
		want := manifestKind(tm.Kind)
		if want.obj == nil || tm.Kind == "Kustomization" || tm.Kind == "Secret" || tm.Kind == "Namespace" {
			t.Errorf("the chart renders a %s (%s), which it should not", tm.Kind, tm.Metadata.Name)
			continue
		}
		if tm.APIVersion != want.apiVersion {
			t.Errorf("%s/%s: apiVersion %q, want %q", tm.Kind, tm.Metadata.Name, tm.APIVersion, want.apiVersion)
		}
		if tm.Metadata.Namespace != "pleg-bridge" {
			t.Errorf("%s/%s is in namespace %q, not the release's", tm.Kind, tm.Metadata.Name, tm.Metadata.Namespace)
		}
		if err := yaml.UnmarshalStrict(doc, want.obj); err != nil {
			t.Errorf("%s/%s does not decode strictly: %v", tm.Kind, tm.Metadata.Name, err)
			continue
		}
		key := tm.Kind + "/" + tm.Metadata.Name
		if _, dup := out[key]; dup {
			t.Errorf("%s is rendered twice", key)
		}
		out[key] = want.obj
	}
	return out
}

// asMaps decodes a multi-document stream into generic objects keyed
// "Kind/name".
func asMaps(t *testing.T, docs [][]byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range docs {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		md, _ := m["metadata"].(map[string]any)
		out[fmt.Sprintf("%v/%v", m["kind"], md["name"])] = m
	}
	return out
}

// labelMaps returns the label maps of obj that kustomize's labels (with
// includeSelectors) and the chart's labels touch: the object's, and a
// workload's selector and pod template's.
func labelMaps(obj map[string]any) []map[string]any {
	get := func(m map[string]any, path ...string) map[string]any {
		for _, k := range path {
			next, _ := m[k].(map[string]any)
			if next == nil {
				return nil
			}
			m = next
		}
		return m
	}
	var out []map[string]any
	for _, path := range [][]string{
		{"metadata", "labels"},
		{"spec", "selector", "matchLabels"},
		{"spec", "template", "metadata", "labels"},
	} {
		if m := get(obj, path...); m != nil {
			out = append(out, m)
		}
	}
	return out
}

// withoutHelmLabels removes helmOnlyLabels from every label map of obj.
func withoutHelmLabels(obj map[string]any) map[string]any {
	for _, m := range labelMaps(obj) {
		for _, l := range helmOnlyLabels {
			delete(m, l)
		}
	}
	return obj
}

func TestHelmLintPassesWithDefaultAndOtherValues(t *testing.T) {
	t.Parallel()
	for _, values := range []string{"", nonDefaultValues} {
		args := []string{"lint", "--strict", chartDir(t)}
		if values != "" {
			args = append(args, "--values", writeValues(t, values))
		}
		if out, err := runHelm(t, args...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

func TestHelmChartWithDefaultValuesRendersDeployKubernetes(t *testing.T) {
	t.Parallel()
	compareChartWithKustomize(t, helmTemplate(t), kustomizeBuild(t, kubernetesDir(t)), "deploy/kubernetes")
}

func TestHelmChartWithMonitoringRendersTheOverlayWithThePrometheusOperatorComponent(t *testing.T) {
	t.Parallel()
	rendered := helmTemplate(t, writeValues(t, "podMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n"))
	kust, err := kustomizeBuildOf(monitoringOverlay(t))
	if err != nil {
		t.Fatal(err)
	}
	compareChartWithKustomize(t, rendered, kust, "the overlay of docs/deployment.md (deploy/kubernetes and components/prometheus-operator)")
}

// compareChartWithKustomize fails the test if the chart's rendering differs
// from the objects kustomize builds from what but for the Namespace, which
// the chart leaves out (Helm installs into an existing namespace or one
// --create-namespace makes), and Helm's own labels.
func compareChartWithKustomize(t *testing.T, rendered []byte, kust map[string]map[string]any, what string) {
	t.Helper()
	decodeRendered(t, rendered)
	chart := asMaps(t, splitYAML(rendered))
	delete(kust, "Namespace/pleg-bridge")
	for key, obj := range chart {
		chart[key] = withoutHelmLabels(obj)
	}
	if diff := cmp.Diff(kust, chart); diff != "" {
		t.Errorf("helm template differs from %s beyond Helm's labels %q (-kustomize +helm):\n%s", what, helmOnlyLabels, diff)
	}
}

func TestHelmChartRulesAreDeployPrometheusRules(t *testing.T) {
	t.Parallel()
	chart, err := os.ReadFile(filepath.Join(chartDir(t), "files", "rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "prometheus", "rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(chart, plain) {
		t.Error("deploy/helm/pleg-bridge/files/rules.yml differs from deploy/prometheus/rules.yml: copy it again")
	}
}

// nonDefaultValues changes every value a user would.
const nonDefaultValues = `
fullnameOverride: events
commonLabels:
  team: platform
image:
  registry: registry.example.com:5000
  repository: mirror/pleg-bridge
  tag: v1.2.3
  pullPolicy: Always
imagePullSecrets:
  - name: regcred
nats:
  existingSecret: other-nats
  urlKey: servers
  credsKey: user.creds
criSocket: /run/crio/crio.sock
dataDir: /srv/pleg-bridge
mode: generic
streamReplicas: 1
logLevel: debug
logFormat: text
goMemLimit: 400MiB
env:
  PLEG_RELIST_PERIOD: 2s
  PLEG_SPOOL_MAX_BYTES: 268435456
  PLEG_CLUSTER_NAME: prod-eu-1
resources:
  requests: {cpu: 50m, memory: 64Mi}
  limits: {memory: 448Mi}
tolerations:
  - key: dedicated
    operator: Equal
    value: gpu
    effect: NoSchedule
nodeSelector:
  kubernetes.io/os: linux
priorityClassName: ""
livenessProbe:
  periodSeconds: 7
  timeoutSeconds: 3
  failureThreshold: 4
  terminationGracePeriodSeconds: 9
podAnnotations:
  example.com/scrape: "false"
podLabels:
  tier: node
serviceAccount:
  name: bridge-sa
podMonitor:
  enabled: false
prometheusRule:
  enabled: true
  additionalLabels:
    release: kube-prometheus-stack
`

func TestHelmChartRendersOtherValues(t *testing.T) {
	t.Parallel()
	objs := decodeRendered(t, helmTemplate(t, writeValues(t, nonDefaultValues)))
	keys := slices.Sorted(maps.Keys(objs))
	if want := []string{"DaemonSet/events", "PrometheusRule/events", "ServiceAccount/bridge-sa"}; !slices.Equal(keys, want) {
		t.Fatalf("rendered %q, want %q (the PodMonitor off)", keys, want)
	}
	ds := objs["DaemonSet/events"].(*appsv1.DaemonSet)
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	env := map[string]*string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = &e.Value
		} else {
			env[e.Name] = nil
		}
	}
	validateEnv(t, "the chart's DaemonSet", env)
	wantEnv := map[string]string{
		"PLEG_CRI_ENDPOINT": "unix:///run/crio/crio.sock", "PLEG_NATS_CREDS": "/etc/pleg-bridge/nats/nats.creds",
		"PLEG_MODE": "generic", "PLEG_STREAM_REPLICAS": "1", "PLEG_LOG_LEVEL": "debug", "PLEG_LOG_FORMAT": "text",
		"GOMEMLIMIT": "400MiB", "PLEG_RELIST_PERIOD": "2s", "PLEG_SPOOL_MAX_BYTES": "268435456", "PLEG_CLUSTER_NAME": "prod-eu-1",
	}
	for name, want := range wantEnv {
		if got := env[name]; got == nil || *got != want {
			t.Errorf("env %s = %v, want %q", name, got, want)
		}
	}
	for _, e := range c.Env {
		if e.Name == "PLEG_NATS_URL" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != "other-nats" || e.ValueFrom.SecretKeyRef.Key != "servers") {
			t.Errorf("PLEG_NATS_URL is not key servers of other-nats: %+v", e.ValueFrom)
		}
	}
	if c.Image != "registry.example.com:5000/mirror/pleg-bridge:v1.2.3" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s (%s)", c.Image, c.ImagePullPolicy)
	}
	if len(pod.ImagePullSecrets) != 1 || pod.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("image pull secrets %+v", pod.ImagePullSecrets)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	if v := volumes["cri-socket"].HostPath; v == nil || v.Path != "/run/crio/crio.sock" {
		t.Errorf("the socket volume is %+v", volumes["cri-socket"])
	}
	if v := volumes["data"].HostPath; v == nil || v.Path != "/srv/pleg-bridge" {
		t.Errorf("the data volume is %+v", volumes["data"])
	}
	if v := volumes["nats-credentials"].Secret; v == nil || v.SecretName != "other-nats" || len(v.Items) != 1 || v.Items[0].Key != "user.creds" {
		t.Errorf("the credentials volume is %+v", volumes["nats-credentials"])
	}
	for _, m := range c.VolumeMounts {
		if m.Name == "cri-socket" && (m.MountPath != "/run/crio/crio.sock" || !m.ReadOnly) {
			t.Errorf("the socket is mounted as %+v", m)
		}
	}
	if got := c.Resources.Limits.Memory().String(); got != "448Mi" {
		t.Errorf("memory limit %s", got)
	}
	if p := c.LivenessProbe; p == nil || p.PeriodSeconds != 7 || p.TimeoutSeconds != 3 || p.FailureThreshold != 4 ||
		p.TerminationGracePeriodSeconds == nil || *p.TerminationGracePeriodSeconds != 9 {
		t.Errorf("liveness probe %+v", c.LivenessProbe)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "dedicated" {
		t.Errorf("tolerations %+v", pod.Tolerations)
	}
	if pod.NodeSelector["kubernetes.io/os"] != "linux" || pod.PriorityClassName != "" {
		t.Errorf("node selector %v, priority class %q", pod.NodeSelector, pod.PriorityClassName)
	}
	if pod.ServiceAccountName != "bridge-sa" {
		t.Errorf("service account %q", pod.ServiceAccountName)
	}
	tmpl := ds.Spec.Template
	if tmpl.Labels["tier"] != "node" || tmpl.Labels["team"] != "platform" || tmpl.Annotations["example.com/scrape"] != "false" {
		t.Errorf("pod labels %v annotations %v", tmpl.Labels, tmpl.Annotations)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(tmpl.Labels)) {
		t.Errorf("the selector %v does not match the pod labels %v", ds.Spec.Selector, tmpl.Labels)
	}
	if pr := objs["PrometheusRule/events"].(*prometheusRule); pr.Metadata.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v", pr.Metadata.Labels)
	}
}

func TestHelmChartRefusesBadValues(t *testing.T) {
	t.Parallel()
	for values, want := range map[string]string{
		"criSocket: run/containerd/containerd.sock": "criSocket must be an absolute path",
		"mode: fast":                      `mode must be auto, evented, containerd-events or generic, got "fast"`,
		"env: {HTTP_PROXY: x}":            "env.HTTP_PROXY: only PLEG_* variables",
		"env: {PLEG_NATS_URL: nats://x}":  "env.PLEG_NATS_URL is set by the chart",
		"nats: {existingSecret: ''}":      "nats.existingSecret is required",
		"dataDir: data":                   "dataDir must be an absolute path",
		"criSockett: /run/crio/crio.sock": "criSockett",
		"image: {tags: v1}":               "tags",
		"streamReplicas: three":           "streamReplicas",
		"image: {pullPolicy: Sometimes}":  "pullPolicy",
		// What the bridge refuses: the error names the value to empty or set.
		"nats: {nkeySeedKey: nkey.seed}":       "at '/nats/credsKey': value must be ''",
		"nats: {tokenKey: a, tokenFileKey: b}": "at '/nats/tokenKey': value must be ''",
		"nats: {tls: {certKey: tls.crt}}":      "at '/nats/tls/keyKey'",
		"nats: {tls: {keyKey: tls.key}}":       "at '/nats/tls/certKey'",
		"nats: {passwordKey: password}":        "at '/nats/userKey'",
		"nats: {tls: {caFile: ca.crt}}":        "caFile",
		"env: {PLEG_NATS_NKEY_SEED: /seed}":    `env.PLEG_NATS_NKEY_SEED is set by the chart: set nats.nkeySeedKey, and nats.credsKey to ""`,
		"env: {PLEG_NATS_TOKEN_FILE: /token}":  "env.PLEG_NATS_TOKEN_FILE is set by the chart: set nats.tokenFileKey",
		"env: {PLEG_NATS_TLS_CERT: /tls.crt}":  "env.PLEG_NATS_TLS_CERT is set by the chart: set nats.tls.certKey",
	} {
		_, err := runHelm(t, "template", "pleg-bridge", chartDir(t), "--values", writeValues(t, values))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: %v, want an error saying %q", values, err, want)
		}
	}
}

// --- credentials: every way the chart authenticates the bridge ---

// testNode is where a rendered pod runs in a test: its name, the paths on
// it that hostPath volumes name, and the Secrets of its namespace.
type testNode struct {
	name      string
	hostPaths map[string]string            // a hostPath volume's path → where it is here
	secrets   map[string]map[string][]byte // Secret name → key → content
}

// containerOnNode returns the arguments and the environment the kubelet
// would give the pod's only container on node, with the container's
// filesystem mapped onto this machine: a variable whose value is a path in
// a volume mount (after "unix://" for a socket) names where that volume is
// here: a hostPath volume's node path from node.hostPaths, or a directory
// holding a Secret volume's items, written as the kubelet writes them. It
// fails the test where the kubelet would not start the container: a Secret
// or a key missing that is not optional, a hostPath the node lacks. The
// only value it changes is PLEG_LISTEN_ADDRESS, the pod's own network
// namespace's port, which becomes a free loopback port: tests share one.
func containerOnNode(t *testing.T, pod corev1.PodSpec, node testNode) (args []string, env map[string]string) {
	t.Helper()
	if len(pod.Containers) != 1 {
		t.Fatalf("the pod has %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	secret := func(name, key string, optional *bool) ([]byte, bool) {
		t.Helper()
		b, ok := node.secrets[name][key]
		if !ok && (optional == nil || !*optional) {
			t.Fatalf("the kubelet would not start the pod: Secret %s has no key %s (it has %v)", name, key, slices.Sorted(maps.Keys(node.secrets[name])))
		}
		return b, ok
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	here := map[string]string{} // mount path → where it is here
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		switch {
		case !ok:
			t.Fatalf("volume mount %s names no volume", m.Name)
		case m.SubPath != "":
			t.Fatalf("volume mount %s has a subPath, which containerOnNode does not implement", m.Name)
		case v.HostPath != nil:
			p, ok := node.hostPaths[v.HostPath.Path]
			if !ok {
				t.Fatalf("the test node has no hostPath %s (volume %s)", v.HostPath.Path, v.Name)
			}
			here[m.MountPath] = p
		case v.Secret != nil:
			dir := t.TempDir()
			mode := os.FileMode(0o644)
			if v.Secret.DefaultMode != nil {
				mode = os.FileMode(*v.Secret.DefaultMode)
			}
			items := v.Secret.Items
			if len(items) == 0 {
				for _, k := range slices.Sorted(maps.Keys(node.secrets[v.Secret.SecretName])) {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				b, ok := secret(v.Secret.SecretName, it.Key, v.Secret.Optional)
				if !ok {
					continue
				}
				m := mode
				if it.Mode != nil {
					m = os.FileMode(*it.Mode)
				}
				if err := os.WriteFile(filepath.Join(dir, it.Path), b, m); err != nil {
					t.Fatal(err)
				}
			}
			here[m.MountPath] = dir
		default:
			t.Fatalf("volume %s is of a kind containerOnNode does not implement: %+v", v.Name, v.VolumeSource)
		}
	}
	mapPath := func(value string) string {
		for _, scheme := range []string{"", "unix://"} {
			rest, ok := strings.CutPrefix(value, scheme)
			if !ok {
				continue
			}
			for mount, dir := range here {
				if rest == mount || strings.HasPrefix(rest, mount+"/") {
					return scheme + dir + rest[len(mount):]
				}
			}
		}
		return value
	}
	env = map[string]string{}
	for _, e := range c.Env {
		switch {
		case strings.Contains(e.Value, "$("):
			t.Fatalf("env %s refers to another variable, which containerOnNode does not implement: %q", e.Name, e.Value)
		case e.ValueFrom == nil:
			env[e.Name] = mapPath(e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = node.name
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if b, ok := secret(ref.Name, ref.Key, ref.Optional); ok {
				env[e.Name] = string(b)
			}
		default:
			t.Fatalf("env %s comes from %+v, which containerOnNode does not implement", e.Name, e.ValueFrom)
		}
	}
	if _, ok := env["PLEG_LISTEN_ADDRESS"]; ok {
		env["PLEG_LISTEN_ADDRESS"] = "127.0.0.1:0"
	}
	return append(slices.Clone(c.Command), c.Args...), env
}

// natsAuthCase is a NATS server that requires one kind of credential, the
// values that give the chart that credential, and the Secrets holding it.
type natsAuthCase struct {
	values  string
	secrets map[string]map[string][]byte
	url     string
	// admin connects with the credential, to read what the bridge published.
	admin []nats.Option
}

// startAuthServer runs a JetStream server with opts until the test ends.
func startAuthServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	return publishtest.RunServer(t, opts)
}

// natsAuthCases are the kinds of credential the chart takes, each with a
// server that requires it.
var natsAuthCases = map[string]func(t *testing.T) natsAuthCase{
	"a credentials file": func(t *testing.T) natsAuthCase {
		s := natsauthtest.Start(t, natsauth.Names{})
		creds, err := os.ReadFile(s.AdminCreds)
		if err != nil {
			t.Fatal(err)
		}
		return natsAuthCase{
			values:  "", // the default: nats.creds
			secrets: map[string]map[string][]byte{"pleg-bridge-nats": {"url": []byte(s.URL), "nats.creds": creds}},
			url:     s.URL, admin: []nats.Option{nats.UserCredentials(s.AdminCreds)},
		}
	},
	"an NKey seed": func(t *testing.T) natsAuthCase {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		s := startAuthServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
		return natsAuthCase{
			values: "nats: {credsKey: '', nkeySeedKey: nkey.seed}",
			secrets: map[string]map[string][]byte{"pleg-bridge-nats": {
				"url": []byte(s.ClientURL()), "nkey.seed": append(seed, '\n'),
			}},
			url: s.ClientURL(), admin: []nats.Option{nats.Nkey(pub, kp.Sign)},
		}
	},
	"a user and a password": func(t *testing.T) natsAuthCase {
		s := startAuthServer(t, &server.Options{Users: []*server.User{{Username: "pleg-bridge", Password: "s3cret"}}})
		return natsAuthCase{
			values: "nats: {credsKey: '', userKey: username, passwordKey: password}",
			secrets: map[string]map[string][]byte{"pleg-bridge-nats": {
				"url": []byte(s.ClientURL()), "username": []byte("pleg-bridge"), "password": []byte("s3cret"),
			}},
			url: s.ClientURL(), admin: []nats.Option{nats.UserInfo("pleg-bridge", "s3cret")},
		}
	},
	"a token": func(t *testing.T) natsAuthCase {
		s := startAuthServer(t, &server.Options{Authorization: "t0ken"})
		return natsAuthCase{
			values:  "nats: {credsKey: '', tokenKey: token}",
			secrets: map[string]map[string][]byte{"pleg-bridge-nats": {"url": []byte(s.ClientURL()), "token": []byte("t0ken")}},
			url:     s.ClientURL(), admin: []nats.Option{nats.Token("t0ken")},
		}
	},
	"a token file": func(t *testing.T) natsAuthCase {
		s := startAuthServer(t, &server.Options{Authorization: "t0ken"})
		return natsAuthCase{
			values:  "nats: {credsKey: '', tokenFileKey: token}",
			secrets: map[string]map[string][]byte{"pleg-bridge-nats": {"url": []byte(s.ClientURL()), "token": []byte("t0ken\n")}},
			url:     s.ClientURL(), admin: []nats.Option{nats.Token("t0ken")},
		}
	},
	"a client certificate (mutual TLS) from another Secret": func(t *testing.T) natsAuthCase {
		pki := newTestPKI(t)
		s := startAuthServer(t, &server.Options{TLS: true, TLSVerify: true, TLSTimeout: 5, TLSConfig: pki.serverConfig(t)})
		url := "tls://" + s.Addr().String()
		dir := t.TempDir()
		files := map[string][]byte{"ca.crt": pki.caPEM, "tls.crt": pki.clientCertPEM, "tls.key": pki.clientKeyPEM}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return natsAuthCase{
			values: "nats: {credsKey: '', tls: {existingSecret: nats-client-tls, caKey: ca.crt, certKey: tls.crt, keyKey: tls.key}}",
			secrets: map[string]map[string][]byte{
				"pleg-bridge-nats": {"url": []byte(url)},
				"nats-client-tls":  files, // cert-manager's keys
			},
			url: url,
			admin: []nats.Option{
				nats.RootCAs(filepath.Join(dir, "ca.crt")),
				nats.ClientCert(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")),
			},
		}
	},
}

// TestHelmChartAuthenticatesTheBridgeWithEveryCredential renders the chart
// for each kind of credential, runs the bridge (run, as main does) with the
// rendered container's arguments, environment and Secret files, on a
// simulated runtime, against a server that refuses a client without that
// credential, and reads the pod's events from the stream.
func TestHelmChartAuthenticatesTheBridgeWithEveryCredential(t *testing.T) {
	t.Parallel()
	helm(t) // skip (or fail in CI) before starting servers
	for name, start := range natsAuthCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := start(t)
			if nc, err := nats.Connect(c.url, nats.NoReconnect(), nats.Timeout(5*time.Second)); err == nil {
				nc.Close()
				t.Fatalf("the server takes a client without %s", name)
			}
			objs := decodeRendered(t, helmTemplate(t, writeValues(t, c.values+"\nstreamReplicas: 1\n")))
			ds := objs["DaemonSet/pleg-bridge"].(*appsv1.DaemonSet)

			model, _, endpoint := startSim(t, crisim.Options{})
			sock, err := cri.ParseEndpoint(endpoint)
			if err != nil {
				t.Fatal(err)
			}
			args, env := containerOnNode(t, ds.Spec.Template.Spec, testNode{
				name:      "node-1",
				hostPaths: map[string]string{"/run/containerd/containerd.sock": sock, "/var/lib/pleg-bridge": t.TempDir()},
				secrets:   c.secrets,
			})
			sb, err := model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "u-web"})
			if err != nil {
				t.Fatal(err)
			}
			ctr, _ := model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"})
			if err := model.StartContainer(ctr); err != nil {
				t.Fatal(err)
			}

			// The two events as they are published, or the bridge's end.
			nc, js := publishtest.Connect(t, c.url, c.admin...)
			published := make(chan *nats.Msg, 2)
			if _, err := nc.ChanSubscribe("pleg.>", published); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var stderr logtest.Buffer
			done := make(chan error, 1)
			go func() { done <- run(ctx, args, envFrom(t, env), io.Discard, &stderr) }()
			deadline := time.After(30 * time.Second)
			for range 2 {
				select {
				case <-published:
				case err := <-done:
					t.Fatalf("the bridge stopped before publishing: %v\n%s", err, stderr.String())
				case <-deadline:
					t.Fatalf("the bridge published nothing within 30s\n%s", stderr.String())
				}
			}
			var got []string
			for _, e := range fetch(t, js, 2) {
				got = append(got, e.LifecycleType()+" "+e.Subject)
			}
			if want := []string{"ContainerStarted shop/web-0", "ContainerStarted shop/web-0/app"}; !slices.Equal(got, want) {
				t.Errorf("events %q, want %q", got, want)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run: %v\n%s", err, stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("run did not return after cancel\n%s", stderr.String())
			}
		})
	}
}

// testPKI is a CA with a certificate for a server on 127.0.0.1 and one for
// a client, PEM-encoded.
type testPKI struct {
	caPEM, serverCertPEM, serverKeyPEM, clientCertPEM, clientKeyPEM []byte
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyPEM := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: b})
	}
	now := time.Now()
	caKey := newKey()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, tmpl *x509.Certificate) (certPEM, kPEM []byte) {
		k := newKey()
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM(k)
	}
	var p testPKI
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	p.serverCertPEM, p.serverKeyPEM = issue(2, &x509.Certificate{
		Subject: pkix.Name{CommonName: "nats"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	p.clientCertPEM, p.clientKeyPEM = issue(3, &x509.Certificate{
		Subject: pkix.Name{CommonName: "pleg-bridge"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return p
}

// serverConfig is the server's side of mutual TLS: its certificate, and a
// client certificate from the CA required.
func (p testPKI) serverConfig(t *testing.T) *tls.Config {
	t.Helper()
	cert, err := tls.X509KeyPair(p.serverCertPEM, p.serverKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	return &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}
}
