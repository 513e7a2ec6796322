package main

// The Helm chart (deploy/helm/pleg-bridge) against deploy/kubernetes and the
// code: helm lint, helm template with default and other values, every
// rendered object decoded strictly, and the default rendering compared with
// what `kubectl apply -k deploy/kubernetes` applies. test/k8s installs both
// on a real node.

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
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

// kustomizeBuild is `kustomize build deploy/kubernetes` for the features its
// kustomization.yaml uses (namespace, labels, images), and fails the test on
// any other. test/k8s compares it with the real kubectl kustomize.
func kustomizeBuild(t *testing.T) map[string]map[string]any {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy", "kubernetes")
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if len(k.CommonLabels) != 0 {
		t.Fatal("kustomization.yaml uses commonLabels, which kustomizeBuild does not apply")
	}
	var docs [][]byte
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatalf("kustomization resource %s: %v", r, err)
		}
		docs = append(docs, b)
	}
	objs := asMaps(t, docs)
	for _, obj := range objs {
		md := obj["metadata"].(map[string]any)
		if obj["kind"] != "Namespace" && k.Namespace != "" {
			md["namespace"] = k.Namespace
		}
		for _, l := range k.Labels {
			if l.IncludeTemplates {
				t.Fatal("kustomization.yaml labels use includeTemplates, which kustomizeBuild does not apply")
			}
			if md["labels"] == nil {
				md["labels"] = map[string]any{}
			}
			maps := labelMaps(obj) // the object's labels first
			if !l.IncludeSelectors {
				maps = maps[:1]
			}
			for _, m := range maps {
				for key, v := range l.Pairs {
					m[key] = v
				}
			}
		}
		if obj["kind"] == "DaemonSet" {
			spec := obj["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
			for _, c := range spec["containers"].([]any) {
				c := c.(map[string]any)
				ref := c["image"].(string)
				for _, img := range k.Images {
					repo, _, _ := strings.Cut(ref, "@")
					if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
						repo = repo[:i]
					}
					if repo != img.Name {
						continue
					}
					ref = repo
					if img.NewName != "" {
						ref = img.NewName
					}
					switch {
					case img.Digest != "":
						ref += "@" + img.Digest
					case img.NewTag != "":
						ref += ":" + img.NewTag
					}
				}
				c["image"] = ref
			}
		}
	}
	return objs
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
	rendered := helmTemplate(t)
	decodeRendered(t, rendered)
	chart := asMaps(t, splitYAML(rendered))
	kust := kustomizeBuild(t)
	// The Namespace is the one object the chart leaves out: Helm installs
	// into an existing namespace or one --create-namespace makes.
	delete(kust, "Namespace/pleg-bridge")
	for key, obj := range chart {
		chart[key] = withoutHelmLabels(obj)
	}
	if diff := cmp.Diff(kust, chart); diff != "" {
		t.Errorf("helm template with default values differs from deploy/kubernetes beyond Helm's labels %q (-kustomize +helm):\n%s",
			helmOnlyLabels, diff)
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
	} {
		_, err := runHelm(t, "template", "pleg-bridge", chartDir(t), "--values", writeValues(t, values))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: %v, want an error saying %q", values, err, want)
		}
	}
}
