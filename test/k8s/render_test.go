//go:build k8s

package k8s

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// TestKustomizeAndHelmRenderTheSameObjects holds deploy/kubernetes and the
// chart's defaults together with the real tools (cmd/pleg-bridge's
// helm_test.go does it with its own kustomize of the features
// kustomization.yaml uses): the same objects but the Namespace, which Helm
// leaves to the user, and Helm's own labels. So do the overlay with the
// Prometheus Operator's component and the chart with podMonitor and
// prometheusRule enabled.
func TestKustomizeAndHelmRenderTheSameObjects(t *testing.T) {
	for _, tt := range []struct {
		name      string
		dir       string
		helmFlags []string
	}{
		{"defaults", filepath.Join(suite.repo, "deploy", "kubernetes"), nil},
		{"with the Prometheus Operator", monitoringOverlay(t), []string{"--set", "podMonitor.enabled=true", "--set", "prometheusRule.enabled=true"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kust := objects(t, kubectl(t, nil, "kustomize", tt.dir))
			out, err := run(nil, suite.helm, append([]string{"template", "pleg-bridge", filepath.Join(suite.repo, "deploy", "helm", "pleg-bridge"),
				"--namespace", "pleg-bridge"}, tt.helmFlags...)...)
			if err != nil {
				t.Fatal(err)
			}
			chart := objects(t, out)
			if _, ok := kust["Namespace/pleg-bridge"]; !ok {
				t.Errorf("kubectl kustomize %s has no Namespace pleg-bridge", tt.dir)
			}
			delete(kust, "Namespace/pleg-bridge")
			for _, obj := range chart {
				for _, path := range [][]string{{"metadata", "labels"}, {"spec", "selector", "matchLabels"}, {"spec", "template", "metadata", "labels"}} {
					m := obj
					for _, k := range path {
						m, _ = m[k].(map[string]any)
					}
					for _, l := range []string{"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"} {
						delete(m, l)
					}
				}
			}
			if diff := cmp.Diff(kust, chart); diff != "" {
				t.Errorf("kubectl kustomize %s and helm template %q differ beyond the Namespace and Helm's labels (-kustomize +helm):\n%s", tt.dir, tt.helmFlags, diff)
			}
		})
	}
}

// monitoringOverlay writes the overlay docs/deployment.md shows, of
// deploy/kubernetes with components/prometheus-operator, to a new
// directory and returns it.
func monitoringOverlay(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(suite.repo, "deploy", "kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s/components/prometheus-operator
`, base, base)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPrometheusOperatorComponentAppliesWhereTheCRDsAre applies the
// overlay with the Prometheus Operator's component, server-side dry run,
// once the operator's CRDs exist: the API server accepts every object. It
// runs after TestBridgeOnARealNode, which wants no such CRDs, and removes
// them again.
func TestPrometheusOperatorComponentAppliesWhereTheCRDsAre(t *testing.T) {
	overlay := monitoringOverlay(t)
	// Without the CRDs, the component's objects are refused: what the base
	// leaves out.
	kubectlQuiet(t, nil, "apply", "-f", filepath.Join(suite.repo, "deploy", "kubernetes", "namespace.yaml"))
	t.Cleanup(func() { _, _ = run(nil, suite.kubectl, "delete", "namespace", namespace, "--wait", "--timeout=120s") })
	if _, err := run(nil, suite.kubectl, "apply", "--dry-run=server", "-k", overlay); err == nil || !strings.Contains(err.Error(), "PodMonitor") {
		t.Errorf("the overlay with the component applies without the operator's CRDs (%v); then the base could hold it", err)
	}

	kubectl(t, []byte(monitoringCRDs), "apply", "-f", "-")
	t.Cleanup(func() {
		_, _ = run(nil, suite.kubectl, "delete", "crd", "podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com", "--wait", "--timeout=60s")
	})
	kubectl(t, nil, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/podmonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")
	out := kubectlQuiet(t, nil, "apply", "--dry-run=server", "-k", overlay)
	for _, want := range []string{"podmonitor.monitoring.coreos.com/pleg-bridge", "prometheusrule.monitoring.coreos.com/pleg-bridge", "daemonset.apps/pleg-bridge"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl apply --dry-run=server -k <overlay> did not apply %s:\n%s", want, out)
		}
	}
}

// objects decodes a multi-document stream, keyed "Kind/name".
func objects(t *testing.T, b []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if m == nil {
			continue
		}
		md, _ := m["metadata"].(map[string]any)
		out[fmt.Sprintf("%v/%v", m["kind"], md["name"])] = m
	}
	return out
}
