package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestDeploymentImageOverlayNeedsKubectlOnly builds the overlay
// docs/deployment.md writes for the image ("The image"): a kustomization
// that kubectl apply -k takes as it is, no kustomize edit, which pins the
// image; and checks what makes its commented socket patch enough: the
// base's first volume is the CRI socket's hostPath, mounted in the
// container at the path PLEG_CRI_ENDPOINT names, so another socket on the
// node changes the hostPath only.
func TestDeploymentImageOverlayNeedsKubectlOnly(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	const heredoc = "cat > pleg-bridge-site/kustomization.yaml <<'EOF'\n"
	_, rest, ok := strings.Cut(string(b), heredoc)
	if !ok {
		t.Fatalf("docs/deployment.md does not write the image overlay with %q", heredoc)
	}
	doc, _, ok := strings.Cut(rest, "\n  EOF\n")
	if !ok {
		t.Fatal("docs/deployment.md: the image overlay's here-document has no EOF line")
	}
	var lines []string
	for l := range strings.Lines(doc + "\n") {
		lines = append(lines, strings.TrimPrefix(l, "  ")) // the list item's indent
	}
	overlay := strings.Join(lines, "")
	if strings.Contains(string(b), "kustomize edit") {
		t.Error("docs/deployment.md still needs kustomize edit, which kubectl does not have")
	}
	objs, err := kustomizeBuildOf(filepath.Join(repoRoot(t), "pleg-bridge-site"), []byte(overlay))
	if err != nil {
		t.Fatalf("the image overlay of docs/deployment.md:\n%s\n%v", overlay, err)
	}
	var ds appsv1.DaemonSet
	decodeObject(t, objs["DaemonSet/pleg-bridge"], &ds)
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Image != "ghcr.io/pleg-bridge/pleg-bridge:v0.1.0" {
		t.Errorf("the overlay gives image %q, want the pinned release", c.Image)
	}

	if !strings.Contains(overlay, "path: /spec/template/spec/volumes/0/hostPath/path") {
		t.Fatal("the overlay's socket patch no longer replaces the first volume's hostPath")
	}
	v := ds.Spec.Template.Spec.Volumes[0]
	if v.HostPath == nil || v.Name != "cri-socket" {
		t.Fatalf("the DaemonSet's first volume is %q (%+v), not the CRI socket's hostPath the patch replaces", v.Name, v.VolumeSource)
	}
	var endpoint string
	for _, e := range c.Env {
		if e.Name == "PLEG_CRI_ENDPOINT" {
			endpoint = e.Value
		}
	}
	for _, m := range c.VolumeMounts {
		if m.Name == v.Name && "unix://"+m.MountPath != endpoint {
			t.Errorf("the socket is mounted at %s, PLEG_CRI_ENDPOINT is %s: a new hostPath alone would not reach the bridge", m.MountPath, endpoint)
		}
	}
}
