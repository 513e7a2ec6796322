//go:build k8s

package k8s

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// TestKustomizeAndHelmRenderTheSameObjects holds deploy/kubernetes and the
// chart's defaults together with the real tools (cmd/pleg-bridge's
// helm_test.go does it with its own kustomize of the features
// kustomization.yaml uses): the same objects but the Namespace, which Helm
// leaves to --create-namespace, and Helm's own labels.
func TestKustomizeAndHelmRenderTheSameObjects(t *testing.T) {
	kust := objects(t, kubectl(t, nil, "kustomize", filepath.Join(suite.repo, "deploy", "kubernetes")))
	out, err := run(nil, suite.helm, "template", "pleg-bridge", filepath.Join(suite.repo, "deploy", "helm", "pleg-bridge"),
		"--namespace", "pleg-bridge")
	if err != nil {
		t.Fatal(err)
	}
	chart := objects(t, out)
	if _, ok := kust["Namespace/pleg-bridge"]; !ok {
		t.Error("kubectl kustomize deploy/kubernetes has no Namespace pleg-bridge")
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
		t.Errorf("kubectl kustomize deploy/kubernetes and helm template differ beyond the Namespace and Helm's labels (-kustomize +helm):\n%s", diff)
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
