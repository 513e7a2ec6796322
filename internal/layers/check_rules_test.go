package layers

import (
	"strings"
	"testing"
)

// TestCheckCatchesBrokenRules holds check to each kind of rule on a small
// graph: clean, it finds nothing; with one arrow added, it finds that arrow
// and names the doc.go whose rule it breaks.
func TestCheckCatchesBrokenRules(t *testing.T) {
	// base is a tidy module: generator over statecache, publish over
	// generator and schemas, bridge and its command above them, a test
	// helper used by a test only.
	base := func() graph {
		g := graph{}
		mod := func(path string, imports ...string) *node {
			g[path] = &node{path: path, inModule: true, imports: imports}
			return g[path]
		}
		ext := func(path string, imports ...string) { g[path] = &node{path: path, imports: imports} }
		std := func(path string) { g[path] = &node{path: path, standard: true} }
		std("context")
		std("sync")
		ext("github.com/nats-io/nats.go")
		ext("google.golang.org/grpc")
		ext("k8s.io/cri-api/pkg/apis/runtime/v1", "google.golang.org/grpc")
		mod("statecache", "sync")
		mod("schemas")
		mod("generator", "statecache", "k8s.io/cri-api/pkg/apis/runtime/v1")
		mod("generator/generatortest", "generator")
		mod("publish", "generator", "schemas", "github.com/nats-io/nats.go").testImports = []string{"generator/generatortest"}
		mod("consumer", "schemas", "github.com/nats-io/nats.go")
		mod("bridge", "generator", "publish", "context")
		mod("cmd/pleg-bridge", "bridge")
		return g
	}
	rules := []rule{
		{pkg: "statecache", may: []string{}, externals: stdlibOnly, mustNotImport: []string{natsLibs}},
		{pkg: "generator", may: []string{"statecache"}, mustNotImport: []string{"publish"}},
		{pkg: "generator/generatortest", may: []string{"generator"}, importedBy: testsOnly},
		{pkg: "publish", may: []string{"generator", "schemas"}},
		{pkg: "consumer", may: []string{"schemas"}, externals: []string{natsClient}, mustNotLink: []string{grpc}},
		{pkg: "bridge", importedBy: []string{"cmd/pleg-bridge"}},
	}
	if vs := check(base(), rules); len(vs) != 0 {
		t.Fatalf("check found violations in a tidy graph: %v", vs)
	}

	tests := []struct {
		name   string
		change func(graph)
		rules  []rule
		from   string
		to     string
		says   []string
	}{{
		name:   "a package that must not import NATS imports it",
		change: addImport("statecache", "github.com/nats-io/nats.go"),
		from:   "statecache",
		to:     "github.com/nats-io/nats.go",
		says:   []string{"statecache/doc.go", "must not import github.com/nats-io/..."},
	}, {
		name:   "a package imports one of the module's packages it does not list",
		change: addImport("publish", "consumer"),
		from:   "publish",
		to:     "consumer",
		says:   []string{"publish/doc.go", "only these packages of the module: generator, schemas"},
	}, {
		name:   "a package imports a module outside its list of externals",
		change: addImport("consumer", "k8s.io/cri-api/pkg/apis/runtime/v1"),
		rules:  []rule{{pkg: "consumer", externals: []string{natsClient}}},
		from:   "consumer",
		to:     "k8s.io/cri-api/pkg/apis/runtime/v1",
		says:   []string{"consumer/doc.go", "only the standard library and github.com/nats-io/nats.go/..."},
	}, {
		name:   "a package links what it must not pull in through another",
		change: addImport("schemas", "k8s.io/cri-api/pkg/apis/runtime/v1"),
		rules:  []rule{{pkg: "consumer", mustNotLink: []string{grpc}}},
		from:   "consumer",
		to:     "google.golang.org/grpc",
		says:   []string{"consumer/doc.go", "consumer → schemas → k8s.io/cri-api/pkg/apis/runtime/v1 → google.golang.org/grpc"},
	}, {
		name:   "a package is imported by one its doc.go does not name",
		change: addImport("consumer", "bridge"),
		rules:  []rule{{pkg: "bridge", importedBy: []string{"cmd/pleg-bridge"}}},
		from:   "consumer",
		to:     "bridge",
		says:   []string{"bridge/doc.go", "only test files and cmd/pleg-bridge may import it"},
	}, {
		name:   "a test helper is imported by a package's non-test files",
		change: addImport("bridge", "generator/generatortest"),
		rules:  []rule{},
		from:   "bridge",
		to:     "generator/generatortest",
		says:   []string{layersDoc, "test helper package generator/generatortest in a non-test file"},
	}, {
		name:   "a test imports a package under cmd/",
		change: func(g graph) { g["publish"].testImports = append(g["publish"].testImports, "cmd/pleg-bridge") },
		from:   "publish",
		to:     "cmd/pleg-bridge",
		says:   []string{layersDoc, "nothing imports a package under cmd/"},
	}, {
		name:   "a rule names a package the module does not have",
		change: func(g graph) { delete(g, "generator/generatortest") },
		rules:  []rule{{pkg: "generator/generatortest", importedBy: testsOnly}},
		from:   "generator/generatortest",
		to:     "",
		says:   []string{"generator/generatortest/doc.go", "no package of the module"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := base()
			tt.change(g)
			rs := rules
			if tt.rules != nil {
				rs = tt.rules
			}
			vs := check(g, rs)
			if len(vs) != 1 {
				t.Fatalf("check found %d violations, want 1 (%s → %s): %v", len(vs), tt.from, tt.to, vs)
			}
			v := vs[0]
			if v.from != tt.from || v.to != tt.to {
				t.Errorf("check found %s → %s, want %s → %s (%s)", v.from, v.to, tt.from, tt.to, v.msg)
			}
			for _, s := range tt.says {
				if !strings.Contains(v.msg, s) {
					t.Errorf("message %q does not say %q", v.msg, s)
				}
			}
		})
	}
}

// addImport returns a change that makes from's non-test files import to.
func addImport(from, to string) func(graph) {
	return func(g graph) { g[from].imports = append(g[from].imports, to) }
}
