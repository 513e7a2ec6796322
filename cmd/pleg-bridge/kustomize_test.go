package main

// deploy/kubernetes as kustomize builds it: the base applies on any cluster
// (built-in kinds only, in a namespace whose Pod Security labels admit the
// bridge without a warning), and the optional component
// components/prometheus-operator adds the PodMonitor and the
// PrometheusRule, through the overlay docs/deployment.md shows. The build
// is kustomizeBuild below, for the features these files use; test/k8s
// compares what it tests with the real `kubectl kustomize` and applies
// both on a cluster without the operator's CRDs.

import (
	"fmt"
	"maps"
	"os"
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

// kustomizeFile is the part of a kustomization.yaml, of kind Kustomization
// or Component, that kustomizeBuild implements; it decodes strictly, so a
// field it does not implement (patches, generators, commonLabels) fails the
// test instead of being ignored.
type kustomizeFile struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string `json:"namespace"`
	Labels          []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors"`
		IncludeTemplates bool              `json:"includeTemplates"`
	} `json:"labels"`
	Resources  []string `json:"resources"`
	Components []string `json:"components"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
		Digest  string `json:"digest"`
	} `json:"images"`
}

// The apiVersions of the two kinds of kustomization.
const (
	kustomizationAPIVersion = "kustomize.config.k8s.io/v1beta1"
	componentAPIVersion     = "kustomize.config.k8s.io/v1alpha1"
)

// selectorKinds are the kinds whose selector and pod template labels
// kustomize's labels transformer sets with includeSelectors (among those
// these files use).
var selectorKinds = map[string]bool{"DaemonSet": true, "Deployment": true, "StatefulSet": true, "ReplicaSet": true}

// kustomizeBuild is `kustomize build dir`: the objects, keyed "Kind/name".
// It fails the test where kustomizeBuildOf returns an error.
func kustomizeBuild(t *testing.T, dir string) map[string]map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kustomizeBuildOf(dir, b)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// kustomizeBuildOf is `kustomize build` of a kustomization.yaml with
// content b in directory dir, which need not exist unless b names files in
// it. It implements what deploy/kubernetes and its overlays use, as
// kustomize does it: resources (files, and directories built first), then
// components (each adds its resources and applies its transformers to
// everything so far), then the kustomization's namespace, labels and
// images. It returns an error for any other feature, and for what kustomize
// refuses: a file outside the kustomization's directory, a directory that
// contains the one being built, two objects of the same kind and name.
func kustomizeBuildOf(dir string, b []byte) (map[string]map[string]any, error) {
	k, err := decodeKustomization(dir, b, "Kustomization")
	if err != nil {
		return nil, err
	}
	objs := map[string]map[string]any{}
	if err := kustomizeAccumulate(dir, k, objs, []string{dir}); err != nil {
		return nil, err
	}
	return objs, nil
}

// decodeKustomization decodes the kustomization.yaml of dir strictly and
// checks it is of kind.
func decodeKustomization(dir string, b []byte, kind string) (kustomizeFile, error) {
	var k kustomizeFile
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		return k, fmt.Errorf("%s/kustomization.yaml uses what kustomizeBuild does not implement: %w", dir, err)
	}
	for _, l := range k.Labels {
		if l.IncludeTemplates {
			return k, fmt.Errorf("%s/kustomization.yaml: labels with includeTemplates, which kustomizeBuild does not implement", dir)
		}
	}
	want := map[string]string{"Kustomization": kustomizationAPIVersion, "Component": componentAPIVersion}[kind]
	// kustomize takes a Kustomization without apiVersion and kind.
	untyped := k.Kind == "" && k.APIVersion == "" && kind == "Kustomization"
	if !untyped && (k.Kind != kind || k.APIVersion != want) {
		return k, fmt.Errorf("%s/kustomization.yaml is %s %s, want %s %s", dir, k.APIVersion, k.Kind, want, kind)
	}
	return k, nil
}

// kustomizeAccumulate adds what the kustomization k of dir builds to objs:
// its resources and components, then its transformers over all of objs.
// visited are the directories being built, for kustomize's cycle check.
func kustomizeAccumulate(dir string, k kustomizeFile, objs map[string]map[string]any, visited []string) error {
	add := func(from string, more map[string]map[string]any) error {
		for key, obj := range more {
			if _, dup := objs[key]; dup {
				return fmt.Errorf("%s: %s is defined twice, which kustomize refuses", from, key)
			}
			objs[key] = obj
		}
		return nil
	}
	for _, r := range k.Resources {
		path := filepath.Join(dir, r)
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("%s: resource %s: %w", dir, r, err)
		}
		var more map[string]map[string]any
		if fi.IsDir() {
			more, err = kustomizeBuildDir(path, "Kustomization", nil, visited)
		} else {
			more, err = kustomizeReadFile(dir, path)
		}
		if err != nil {
			return err
		}
		if err := add(path, more); err != nil {
			return err
		}
	}
	for _, c := range k.Components {
		if _, err := kustomizeBuildDir(filepath.Join(dir, c), "Component", objs, visited); err != nil {
			return err
		}
	}
	kustomizeTransform(k, objs)
	return nil
}

// kustomizeReadFile decodes the objects of a resource file of the
// kustomization in dir.
func kustomizeReadFile(dir, path string) (map[string]map[string]any, error) {
	if rel, err := filepath.Rel(dir, path); err != nil || !filepath.IsLocal(rel) {
		return nil, fmt.Errorf("%s: resource %s is outside the kustomization's directory, which kustomize refuses", dir, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs := map[string]map[string]any{}
	for _, doc := range splitYAML(b) {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		md, _ := m["metadata"].(map[string]any)
		objs[fmt.Sprintf("%v/%v", m["kind"], md["name"])] = m
	}
	return objs, nil
}

// kustomizeBuildDir builds the kustomization of kind in directory dir: into
// objs for a Component, into a new map, which it returns, for a resource.
func kustomizeBuildDir(dir, kind string, objs map[string]map[string]any, visited []string) (map[string]map[string]any, error) {
	for _, v := range visited {
		if rel, err := filepath.Rel(dir, v); err == nil && filepath.IsLocal(rel) {
			return nil, fmt.Errorf("%s contains %s, which includes it: kustomize refuses the cycle", dir, v)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	k, err := decodeKustomization(dir, b, kind)
	if err != nil {
		return nil, err
	}
	if objs == nil {
		objs = map[string]map[string]any{}
	}
	if err := kustomizeAccumulate(dir, k, objs, append(slices.Clone(visited), dir)); err != nil {
		return nil, err
	}
	return objs, nil
}

// kustomizeTransform applies k's namespace, labels and images to objs.
func kustomizeTransform(k kustomizeFile, objs map[string]map[string]any) {
	for key, obj := range objs {
		md := obj["metadata"].(map[string]any)
		if k.Namespace != "" {
			if obj["kind"] == "Namespace" {
				// kustomize renames the Namespace objects it holds.
				md["name"] = k.Namespace
				delete(objs, key)
				objs["Namespace/"+k.Namespace] = obj
			} else {
				md["namespace"] = k.Namespace
			}
		}
		for _, l := range k.Labels {
			if md["labels"] == nil {
				md["labels"] = map[string]any{}
			}
			ms := labelMaps(obj) // the object's labels first
			if !l.IncludeSelectors || !selectorKinds[obj["kind"].(string)] {
				ms = ms[:1]
			}
			for _, m := range ms {
				maps.Copy(m, anyMap(l.Pairs))
			}
		}
		if len(k.Images) > 0 && obj["kind"] == "DaemonSet" {
			spec := obj["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
			for _, c := range spec["containers"].([]any) {
				c := c.(map[string]any)
				c["image"] = kustomizeImage(c["image"].(string), k)
			}
		}
	}
}

func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// kustomizeImage is ref with k's images applied.
func kustomizeImage(ref string, k kustomizeFile) string {
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
	return ref
}

func kubernetesDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(repoRoot(t), "deploy", "kubernetes")
}

// monitoringOverlay is the overlay docs/deployment.md tells users to write
// to add the Prometheus Operator's objects: its directory, my-pleg-bridge
// at the repository's root where the documentation's commands run (it need
// not exist), and its content.
func monitoringOverlay(t *testing.T) (dir string, content []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	const heredoc = "cat > my-pleg-bridge/kustomization.yaml <<'EOF'\n"
	_, rest, ok := strings.Cut(string(b), heredoc)
	if !ok {
		t.Fatalf("docs/deployment.md does not write the overlay with %q", heredoc)
	}
	doc, _, ok := strings.Cut(rest, "\nEOF\n")
	if !ok {
		t.Fatal("docs/deployment.md: the overlay's here-document has no EOF line")
	}
	return filepath.Join(repoRoot(t), "my-pleg-bridge"), []byte(doc)
}

func TestKustomizeBaseHasOnlyBuiltInKinds(t *testing.T) {
	t.Parallel()
	objs := kustomizeBuild(t, kubernetesDir(t))
	keys := slices.Sorted(maps.Keys(objs))
	if want := []string{"DaemonSet/pleg-bridge", "Namespace/pleg-bridge", "ServiceAccount/pleg-bridge"}; !slices.Equal(keys, want) {
		t.Errorf("kustomize build deploy/kubernetes = %q, want %q: built-in kinds only, so that it applies on a cluster without the Prometheus Operator's CRDs", keys, want)
	}
	for key, obj := range objs {
		if v := obj["apiVersion"]; v != "v1" && v != "apps/v1" {
			t.Errorf("%s has apiVersion %v: a cluster without its CRD refuses it", key, v)
		}
	}
}

// podSecurityLevels are the Pod Security Standards' levels, from the least
// to the most restrictive.
var podSecurityLevels = []string{"privileged", "baseline", "restricted"}

func TestKustomizeNamespaceAdmitsTheBridgeWithoutAWarning(t *testing.T) {
	t.Parallel()
	objs := kustomizeBuild(t, kubernetesDir(t))
	var ns corev1.Namespace
	var ds appsv1.DaemonSet
	decodeObject(t, objs["Namespace/pleg-bridge"], &ns)
	decodeObject(t, objs["DaemonSet/pleg-bridge"], &ds)
	for key, obj := range objs {
		if got := obj["metadata"].(map[string]any)["namespace"]; key != "Namespace/pleg-bridge" && got != ns.Name {
			t.Errorf("%s is in namespace %v, not %s", key, got, ns.Name)
		}
	}

	// The least restrictive level is the only one that admits a pod with
	// hostPath volumes; baseline and restricted forbid them.
	var hostPaths []string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	if len(hostPaths) == 0 {
		t.Fatal("the DaemonSet has no hostPath volume any more: the namespace could enforce baseline or restricted; tighten it")
	}
	for _, mode := range []string{"enforce", "warn"} {
		if got := ns.Labels["pod-security.kubernetes.io/"+mode]; got != "privileged" {
			t.Errorf("namespace label pod-security.kubernetes.io/%s=%q: the bridge's hostPath volumes %q need privileged, "+
				"or the apply is refused (enforce) or prints a warning (warn)", mode, got, hostPaths)
		}
	}
	if got := ns.Labels["pod-security.kubernetes.io/audit"]; !slices.Contains(podSecurityLevels, got) {
		t.Errorf("namespace label pod-security.kubernetes.io/audit=%q is not a level (%q)", got, podSecurityLevels)
	}
}

func TestKustomizePrometheusOperatorComponentAddsTheMonitoringObjects(t *testing.T) {
	t.Parallel()
	base := kustomizeBuild(t, kubernetesDir(t))
	dir, overlay := monitoringOverlay(t)
	objs, err := kustomizeBuildOf(dir, overlay)
	if err != nil {
		t.Fatalf("the overlay of docs/deployment.md:\n%s\n%v", overlay, err)
	}

	// The overlay of docs/deployment.md: the base unchanged, and the two
	// objects of the component.
	for key, obj := range base {
		if diff := cmp.Diff(obj, objs[key]); diff != "" {
			t.Errorf("%s differs in the overlay with the component (-base +overlay):\n%s", key, diff)
		}
	}
	added := slices.Sorted(maps.Keys(objs))
	added = slices.DeleteFunc(added, func(k string) bool { _, ok := base[k]; return ok })
	if want := []string{"PodMonitor/pleg-bridge", "PrometheusRule/pleg-bridge"}; !slices.Equal(added, want) {
		t.Fatalf("the component adds %q, want %q", added, want)
	}

	// Both decode strictly and carry the base's namespace and label, as if
	// the base's transformers had seen them.
	var ds appsv1.DaemonSet
	decodeObject(t, objs["DaemonSet/pleg-bridge"], &ds)
	var pm podMonitor
	var pr prometheusRule
	decodeObject(t, objs["PodMonitor/pleg-bridge"], &pm)
	decodeObject(t, objs["PrometheusRule/pleg-bridge"], &pr)
	for _, md := range []metav1.ObjectMeta{pm.Metadata, pr.Metadata} {
		if md.Namespace != ds.Namespace || md.Labels["app.kubernetes.io/name"] != ds.Labels["app.kubernetes.io/name"] {
			t.Errorf("%s is in namespace %q with labels %v; the base's objects are in %q with app.kubernetes.io/name=%s",
				md.Name, md.Namespace, md.Labels, ds.Namespace, ds.Labels["app.kubernetes.io/name"])
		}
	}

	// The PodMonitor scrapes the bridge's metrics port, with the job label
	// the alerting rules select.
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("the PodMonitor's selector %s does not select the bridge's pods %v", sel, ds.Spec.Template.Labels)
	}
	ports := ds.Spec.Template.Spec.Containers[0].Ports
	if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" ||
		!slices.ContainsFunc(ports, func(p corev1.ContainerPort) bool { return p.Name == pm.Spec.PodMetricsEndpoints[0].Port }) {
		t.Errorf("the PodMonitor scrapes %+v; the container's ports are %+v", pm.Spec.PodMetricsEndpoints, ports)
	}
	if job := ds.Spec.Template.Labels[pm.Spec.JobLabel]; pm.Spec.JobLabel == "" || job != alertJob {
		t.Errorf("the PodMonitor's jobLabel %q gives the bridge's pods job=%q, want %q, which the alerting rules select", pm.Spec.JobLabel, job, alertJob)
	}

	// The PrometheusRule holds deploy/prometheus/rules.yml.
	if diff := cmp.Diff(loadRules(t), pr.Spec); diff != "" {
		t.Errorf("the component's prometheusrule.yaml and deploy/prometheus/rules.yml differ (-rules.yml +prometheusrule.yaml):\n%s", diff)
	}
}

func TestKustomizeBuildRefusesWhatItDoesNotImplement(t *testing.T) {
	t.Parallel()
	overlay := filepath.Join(kubernetesDir(t), "..", "overlay")
	for name, k := range map[string]string{
		"a patch":                              "resources: [../kubernetes]\npatches: [{path: p.yaml}]",
		"commonLabels":                         "resources: [../kubernetes]\ncommonLabels: {a: b}",
		"a directory containing it":            "resources: [..]",
		"a file outside its directory":         "resources: [../kubernetes/daemonset.yaml]",
		"the base twice":                       "resources: [../kubernetes, ../kubernetes/components/../]",
		"a component as a resource":            "resources: [../kubernetes/components/prometheus-operator]",
		"the base as a component":              "components: [../kubernetes]",
		"labels with includeTemplates":         "labels: [{pairs: {a: b}, includeTemplates: true}]",
		"a Component built as a kustomization": "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component",
	} {
		if _, err := kustomizeBuildOf(overlay, []byte(k)); err == nil {
			t.Errorf("kustomizeBuild accepts %s", name)
		}
	}
}

// decodeObject decodes a built object strictly into out.
func decodeObject(t *testing.T, obj map[string]any, out any) {
	t.Helper()
	if obj == nil {
		t.Fatalf("no object to decode into %T", out)
	}
	b, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, out); err != nil {
		t.Fatalf("%s/%v does not decode strictly into %T: %v", obj["kind"], obj["metadata"].(map[string]any)["name"], out, err)
	}
}
