package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pointer is the sentence by which a doc.go that states import rules
// points at the test that checks them.
const pointer = "The import rules below are checked by internal/layers/layers_test.go (TestImportRules)."

// TestImportRules checks the module's import graph, as `go list` gives it,
// against the rules of the packages' doc.go files (rules_test.go) and the
// rules of every package (doc.go of this package).
func TestImportRules(t *testing.T) {
	g, _ := loadGraph(t)
	known := map[[2]string]knownViolation{}
	for _, k := range knownViolations {
		known[[2]string{k.from, k.to}] = k
	}
	found := map[[2]string]bool{}
	for _, v := range check(g, rules) {
		key := [2]string{v.from, v.to}
		if k, ok := known[key]; ok {
			found[key] = true
			t.Logf("known violation, to be fixed (listed in knownViolations): %s; why it exists: %s", v.msg, k.why)
			continue
		}
		t.Error(v.msg)
	}
	for _, k := range knownViolations {
		if !found[[2]string{k.from, k.to}] {
			t.Errorf("knownViolations lists %s → %s, which breaks no rule any more: remove its entry from rules_test.go", k.from, k.to)
		}
	}
}

// TestRuleTableMatchesDocs checks that every doc.go that speaks of imports
// has its entry in the table and points at TestImportRules, and that every
// entry's doc.go exists.
func TestRuleTableMatchesDocs(t *testing.T) {
	g, root := loadGraph(t)
	inTable := map[string]bool{}
	for _, r := range rules {
		if inTable[r.pkg] {
			t.Errorf("rules_test.go has two entries for %s", r.pkg)
		}
		inTable[r.pkg] = true
	}
	speaksOfImports := regexp.MustCompile(`\bimport(s|ed)?\b`)
	for path, n := range g {
		if !n.inModule {
			continue
		}
		text, err := os.ReadFile(filepath.Join(n.dir, "doc.go"))
		if errors.Is(err, os.ErrNotExist) {
			if inTable[path] {
				t.Errorf("rules_test.go has an entry for %s, which has no doc.go to state it", path)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		prose := docProse(text)
		if !speaksOfImports.MatchString(prose) {
			continue
		}
		if !inTable[path] {
			t.Errorf("%s/doc.go speaks of imports, but rules_test.go has no entry for %s: restate its rules there", path, path)
		}
		if path != "internal/layers" && !strings.Contains(prose, pointer) {
			rel, _ := filepath.Rel(root, filepath.Join(n.dir, "doc.go"))
			t.Errorf("%s states import rules but does not point at their test; add the sentence %q", rel, pointer)
		}
	}
}

// docProse returns the text of a doc.go's comment lines, joined by single
// spaces, so that a sentence reads the same however it is wrapped.
func docProse(src []byte) string {
	var words []string
	for line := range strings.Lines(string(src)) {
		if text, ok := strings.CutPrefix(strings.TrimSpace(line), "//"); ok {
			words = append(words, strings.Fields(text)...)
		}
	}
	return strings.Join(words, " ")
}

// listed is the part of `go list -json` output that loadGraph reads.
type listed struct {
	ImportPath   string
	Dir          string
	Standard     bool
	Module       *struct{ Path string }
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// loadGraph lists every package of the module, with the build tags of the
// tests that need a real containerd or Kubernetes node, and their
// dependencies. It returns the graph and the module's root directory.
func loadGraph(t *testing.T) (graph, string) {
	t.Helper()
	var mod struct{ Path, Dir string }
	if err := json.Unmarshal(goList(t, "-m", "-json"), &mod); err != nil {
		t.Fatalf("decode go list -m -json: %v", err)
	}
	out := goList(t, "-deps", "-tags=e2e,k8s",
		"-json=ImportPath,Dir,Standard,Module,Imports,TestImports,XTestImports,Error",
		mod.Path+"/...")
	rel := func(path string) string {
		if r, ok := strings.CutPrefix(path, mod.Path+"/"); ok {
			return r
		}
		return path
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list -json: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		n := &node{
			path:     rel(p.ImportPath),
			inModule: p.Module != nil && p.Module.Path == mod.Path,
			standard: p.Standard,
			dir:      p.Dir,
		}
		for _, imp := range p.Imports {
			n.imports = append(n.imports, rel(imp))
		}
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			if imp != p.ImportPath {
				n.testImports = append(n.testImports, rel(imp))
			}
		}
		g[n.path] = n
	}
	if len(g) == 0 || g["generator"] == nil {
		t.Fatalf("go list found no packages of %s (not even generator)", mod.Path)
	}
	return g, mod.Dir
}

// goList runs the go command's list with args in the test's directory,
// inside the module.
func goList(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}
