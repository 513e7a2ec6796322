package layers

import (
	"fmt"
	"slices"
	"strings"
)

// A rule is what one package's doc.go says the package may and must not
// import. A nil list states nothing; an empty one allows nothing.
type rule struct {
	// pkg is the package, relative to the module root; its doc.go states
	// the rule.
	pkg string
	// may lists the module's packages that pkg's non-test files may import;
	// an import of any other package of the module breaks the rule.
	may []string
	// externals, if not nil, are the only packages outside the module and
	// the standard library that pkg's non-test files may import.
	externals []string
	// mustNotImport are patterns pkg's non-test files must not import.
	mustNotImport []string
	// mustNotLink are patterns that must not be among pkg's dependencies at
	// any depth (its test files aside).
	mustNotLink []string
	// importedBy, if not nil, are the only module packages whose non-test
	// files may import pkg.
	importedBy []string
}

func (r rule) doc() string { return r.pkg + "/doc.go" }

// layersDoc states the rules that hold for every package.
const layersDoc = "internal/layers/doc.go"

// A knownViolation is an arrow that breaks a rule today, from one package
// to another, and is being fixed elsewhere.
type knownViolation struct {
	from, to string
	why      string
}

// A violation is an arrow, from a package to one it imports or links, that
// breaks a rule; msg says which and names the doc.go that states it.
type violation struct {
	from, to string
	msg      string
}

// A node is one package of the import graph. Paths of the module's packages
// are relative to the module root; others are full import paths.
type node struct {
	path     string
	inModule bool
	standard bool
	dir      string
	// imports are the imports of the package's non-test files; testImports
	// those of its test files (internal and external), itself excluded.
	imports     []string
	testImports []string
}

type graph map[string]*node

// match reports whether path is named by pattern: the same path, or one
// below it for a pattern that ends in "/...".
func match(path, pattern string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func matchAny(path string, patterns []string) (string, bool) {
	for _, p := range patterns {
		if match(path, p) {
			return p, true
		}
	}
	return "", false
}

// isTestHelper reports whether the module's package path is a test helper
// package: its last element ends in "test" (generatortest, publishtest).
func isTestHelper(path string) bool {
	last := path[strings.LastIndex(path, "/")+1:]
	return len(last) > len("test") && strings.HasSuffix(last, "test")
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// check returns the violations of rules, and of the rules that hold for
// every package, in g. An arrow is reported once, for the first rule it
// breaks; a rule that names a package g does not hold is reported too, with
// an empty to.
func check(g graph, rules []rule) []violation {
	var out []violation
	seen := map[[2]string]bool{}
	add := func(from, to, format string, args ...any) {
		if seen[[2]string{from, to}] {
			return
		}
		seen[[2]string{from, to}] = true
		out = append(out, violation{from: from, to: to, msg: fmt.Sprintf(format, args...)})
	}
	inModule := func(path string) bool {
		n, ok := g[path]
		return ok && n.inModule
	}
	modulePaths := make([]string, 0, len(g))
	for path, n := range g {
		if n.inModule {
			modulePaths = append(modulePaths, path)
		}
	}
	slices.Sort(modulePaths)

	for _, r := range rules {
		n, ok := g[r.pkg]
		if !ok || !n.inModule {
			add(r.pkg, "", "%s states import rules for %s, which is no package of the module: update the table in rules_test.go", r.doc(), r.pkg)
			continue
		}
		for _, named := range slices.Concat(r.may, r.importedBy) {
			if !inModule(named) {
				add(r.pkg, named, "the rule of %s names %s, which is no package of the module: update the table in rules_test.go", r.doc(), named)
			}
		}
		for _, imp := range n.imports {
			if p, bad := matchAny(imp, r.mustNotImport); bad {
				add(r.pkg, imp, "%s imports %s, but %s says it must not import %s", r.pkg, imp, r.doc(), p)
				continue
			}
			switch {
			case inModule(imp):
				if r.may != nil && !slices.Contains(r.may, imp) {
					add(r.pkg, imp, "%s imports %s, but %s allows it only these packages of the module: %s", r.pkg, imp, r.doc(), list(r.may))
				}
			case g[imp] != nil && g[imp].standard:
			default:
				if r.externals != nil {
					if _, ok := matchAny(imp, r.externals); !ok {
						add(r.pkg, imp, "%s imports %s, but %s allows it only the standard library and %s", r.pkg, imp, r.doc(), list(r.externals))
					}
				}
			}
		}
		for _, p := range r.mustNotLink {
			if chain := findLink(g, r.pkg, p); chain != nil {
				to := chain[len(chain)-1]
				add(r.pkg, to, "%s links %s (%s), but %s says it must not pull in %s", r.pkg, to, strings.Join(chain, " → "), r.doc(), p)
			}
		}
		if r.importedBy != nil {
			for _, from := range modulePaths {
				if from != r.pkg && slices.Contains(g[from].imports, r.pkg) && !slices.Contains(r.importedBy, from) {
					who := "only test files"
					if len(r.importedBy) > 0 {
						who = "only test files and " + list(r.importedBy)
					}
					add(from, r.pkg, "%s imports %s, but %s says %s may import it", from, r.pkg, r.doc(), who)
				}
			}
		}
	}

	for _, from := range modulePaths {
		n := g[from]
		for _, imp := range slices.Concat(n.imports, n.testImports) {
			if inModule(imp) && match(imp, "cmd/...") && !match(from, "cmd/...") {
				add(from, imp, "%s imports %s, but %s says nothing imports a package under cmd/", from, imp, layersDoc)
			}
		}
		if isTestHelper(from) {
			continue
		}
		for _, imp := range n.imports {
			if inModule(imp) && isTestHelper(imp) {
				add(from, imp, "%s imports the test helper package %s in a non-test file, but %s says only test files and other test helpers may", from, imp, layersDoc)
			}
		}
	}
	return out
}

// findLink returns the shortest chain of non-test imports from the package
// from to a package that pattern names, or nil if there is none.
func findLink(g graph, from, pattern string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != from && match(cur, pattern) {
			var chain []string
			for p := cur; p != ""; p = prev[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		n := g[cur]
		if n == nil {
			continue
		}
		for _, imp := range n.imports {
			if _, ok := prev[imp]; !ok {
				prev[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return nil
}
