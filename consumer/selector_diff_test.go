package consumer_test

import (
	"errors"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// The differential tests hold ParseSelector, Selector and ValidateNamespace
// to what k8s.io/apimachinery does with the same input: the same
// error/no-error decision for every selector, the same Matches result for
// every label map, the same String. Only these tests import apimachinery;
// consumer itself must not (TestConsumerDoesNotDependOnApimachinery).

// trickySelectors are the table of the differential test and the seed
// corpus of its fuzz target.
var trickySelectors = []string{
	"", " ", "\t\r\n", ",", "(", ")", "=", "!", "!!a", "a!", "a!b",
	"app=web", "app==web", "app!=web", "app = web", "app=", "app==", "app!=", "app=,tier", "=web",
	"app", "!app", "! app", "!app=web", "!app,tier", "app,", ",app", "app,,tier", "app web",
	"a=b=c", "a==b==c", "a!==b", "a===b", "a=!b", "a=(b)", "a=b)", "a=b,", "a,a", "a=b,a=c",
	"env in (prod,stage)", "env in (prod, stage)", "env in(prod)", "env notin (dev)", "env notin(dev)",
	"env in ()", "env notin ()", "env in (,)", "env in (,,)", "env in (a,,b)", "env in (,a)", "env in (a,)",
	"env in (a b)", "env in (a", "env in (a,", "env in (", "env in", "env in a", "env in ((a))", "env in (a))",
	"env in (!)", "env in (a,!)", "env in (=)", "env in (stage,prod,stage)", "env in (a),tier notin (b),!c,d",
	"envin (a)", "env inn (a)", "env IN (a)",
	"in", "!in", "notin", "in in (in)", "notin notin (notin)", "in=in", "a=in", "a in (notin)", "in,notin",
	"x>1", "x<10", "x>", "x<", "x>a", "x>-1", "x>+1", "x>=1", "x<=1", "x>1_0", "x>007", "x>0x10",
	"x>9223372036854775807", "x>9223372036854775808", "x<-9223372036854775808", "x>99999999999999999999",
	"x>1,x<5", "x > 1", "x>1.5",
	"example.com/app=web", "app.kubernetes.io/name in (web)", "Example.com/app=web", "example.com/App=web",
	"EXAMPLE/app", "example..com/app", ".example.com/app", "example.com./app", "ex-ample.com/app", "-example.com/app",
	"example-.com/app", "1.2.3/app", "/app", "example.com/", "/", "a/b/c", "a//b",
	"a-", "-a", "a_b", "_a", "a.b", "a..b", "A", "1", "a-b_c.d",
	"app=-web", "app=web-", "app=web_1.2", "app=.", "app=_", "app in (-a)", "app=a/b",
	"\x00", "a\x00", "a\x00b", "a \x00b", "a\x00 b", "a\x00\x00b", "a=\x00b", "a\x00=b", "a=\x00", "a=b\x00,c",
	"!\x00a", "a in (\x00b)", "a in\x00(b)", "a\x00in (b)", "a=\x00\x00b", "a =\x00 b",
	"é=1", "a=é", "a\v", "a\f=b", "a\r\n=\tb", "\ufeffa", "a=b\xff", "\xff",
	strings.Repeat("k", 63), strings.Repeat("k", 64), "a=" + strings.Repeat("v", 63), "a=" + strings.Repeat("v", 64),
	strings.Repeat("p", 253) + "/a", strings.Repeat("p", 254) + "/a", strings.Repeat("p.", 126) + "p/a",
	strings.Repeat("p", 70) + ".com/a", "a in (" + strings.Repeat("v", 64) + ")",
	"app in (web),tier notin (db),!canary,track,version!=v1,replicas>1",
}

// fixedLabelMaps are label maps every selector is matched against, beside
// the maps labelMapsFor derives from the selector itself.
var fixedLabelMaps = []map[string]string{
	nil,
	{},
	{"app": "web"},
	{"app": ""},
	{"app": "db", "env": "prod", "tier": "db"},
	{"env": "", "x": "5", "in": "in", "notin": "notin"},
	{"x": "-3", "a": "b"},
	{"x": "+7", "a": "c"},
	{"x": "abc", "example.com/app": "web"},
}

// TestSelectorAgainstApimachinery runs the table of tricky selectors.
func TestSelectorAgainstApimachinery(t *testing.T) {
	t.Parallel()
	for _, s := range trickySelectors {
		checkSelectorAgainstApimachinery(t, s)
		checkNamespaceAgainstApimachinery(t, s)
	}
	// Namespaces are short, so the table above holds few.
	for _, ns := range []string{"default", "kube-system", "a", "1", "-", "a-", "-a", "a--b", "A", "a.b", "a_b", "é",
		strings.Repeat("n", 63), strings.Repeat("n", 64)} {
		checkNamespaceAgainstApimachinery(t, ns)
	}
}

// FuzzSelectorAgainstApimachinery compares ParseSelector and the parsed
// Selector with apimachinery on any input, and ValidateNamespace with
// validation.IsDNS1123Label on the same input. A plain go test runs the
// seeds, trickySelectors.
func FuzzSelectorAgainstApimachinery(f *testing.F) {
	for _, s := range trickySelectors {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkSelectorAgainstApimachinery(t, s)
		checkNamespaceAgainstApimachinery(t, s)
	})
}

func checkSelectorAgainstApimachinery(t *testing.T, s string) {
	t.Helper()
	ours, err := consumer.ParseSelector(s)
	theirs, theirErr := labels.Parse(s)
	switch {
	case err != nil && theirErr != nil:
		if !errors.Is(err, consumer.ErrInvalidSelector) {
			t.Errorf("ParseSelector(%q) error %v does not wrap ErrInvalidSelector", s, err)
		}
		if !strings.Contains(err.Error(), strconv.Quote(s)) {
			t.Errorf("ParseSelector(%q) error %v does not name the selector", s, err)
		}
		return
	case err != nil:
		t.Fatalf("ParseSelector(%q): %v; apimachinery parses it as %q", s, err, theirs)
	case theirErr != nil:
		t.Fatalf("ParseSelector(%q) = %q; apimachinery fails: %v", s, ours, theirErr)
	}

	if ours.Empty() != theirs.Empty() {
		t.Errorf("ParseSelector(%q).Empty() = %v, apimachinery says %v", s, ours.Empty(), theirs.Empty())
	}
	theirReqs, _ := theirs.Requirements()
	// apimachinery sorts requirements with sort.Sort, which may reorder
	// requirements on the same key; ParseSelector keeps their order. So
	// the text must be equal when keys are distinct, and the requirements
	// the same (as a multiset) always.
	if distinctKeys(theirReqs) && ours.String() != theirs.String() {
		t.Errorf("ParseSelector(%q).String() = %q, apimachinery says %q", s, ours.String(), theirs.String())
	}
	ourReparsed, err := labels.Parse(ours.String())
	if err != nil {
		t.Fatalf("apimachinery cannot parse the String %q of %q: %v", ours.String(), s, err)
	}
	ourReqs, _ := ourReparsed.Requirements()
	if got, want := requirementStrings(ourReqs), requirementStrings(theirReqs); !slices.Equal(got, want) {
		t.Errorf("ParseSelector(%q) has requirements %q, apimachinery %q", s, got, want)
	}
	again, err := consumer.ParseSelector(ours.String())
	if err != nil {
		t.Fatalf("ParseSelector(%q), the String of %q: %v", ours.String(), s, err)
	}
	if again.String() != ours.String() {
		t.Errorf("String does not round-trip: %q (from %q) parses to %q", ours.String(), s, again.String())
	}

	for _, m := range append(labelMapsFor(theirReqs), fixedLabelMaps...) {
		want := theirs.Matches(labels.Set(m))
		if got := ours.Matches(m); got != want {
			t.Errorf("ParseSelector(%q).Matches(%v) = %v, apimachinery says %v", s, m, got, want)
		}
		if got := again.Matches(m); got != want {
			t.Errorf("ParseSelector(%q).Matches(%v) (re-parsed from its String) = %v, apimachinery says %v", s, m, got, want)
		}
	}
}

func checkNamespaceAgainstApimachinery(t *testing.T, ns string) {
	t.Helper()
	err := consumer.ValidateNamespace(ns)
	want := validation.IsDNS1123Label(ns)
	switch {
	case err == nil && len(want) > 0:
		t.Errorf("ValidateNamespace(%q) = nil, apimachinery says %q", ns, want)
	case err != nil && len(want) == 0:
		t.Errorf("ValidateNamespace(%q) = %v, apimachinery says it is valid", ns, err)
	case err != nil && !errors.Is(err, consumer.ErrInvalidNamespace):
		t.Errorf("ValidateNamespace(%q) = %v, want an error wrapping ErrInvalidNamespace", ns, err)
	}
}

func distinctKeys(reqs labels.Requirements) bool {
	seen := make(map[string]bool, len(reqs))
	for _, r := range reqs {
		if seen[r.Key()] {
			return false
		}
		seen[r.Key()] = true
	}
	return true
}

func requirementStrings(reqs labels.Requirements) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, r.String())
	}
	slices.Sort(out)
	return out
}

// labelMapsFor returns label maps on the boundaries of the requirements:
// one where every key has the first value its requirement names, and for
// each requirement, maps where its key is missing or has each of its
// values, the empty value, another value, or (for a number) one more or
// one less.
func labelMapsFor(reqs labels.Requirements) []map[string]string {
	base := map[string]string{}
	for _, r := range reqs {
		base[r.Key()] = "x"
		if vs := r.Values().List(); len(vs) > 0 {
			base[r.Key()] = vs[0]
		}
	}
	out := []map[string]string{base}
	for _, r := range reqs {
		missing := maps.Clone(base)
		delete(missing, r.Key())
		out = append(out, missing)
		candidates := append(r.Values().List(), "", "other", "x")
		for _, v := range r.Values().List() {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				candidates = append(candidates, strconv.FormatInt(n-1, 10), strconv.FormatInt(n+1, 10), "+"+v)
			}
		}
		for _, v := range candidates {
			m := maps.Clone(base)
			m[r.Key()] = v
			out = append(out, m)
		}
	}
	return out
}

// TestConsumerDoesNotDependOnApimachinery: consumer itself (not its tests)
// must not import k8s.io/apimachinery, directly or through another
// package, or every service that imports consumer would build klog and
// more. That is why ParseSelector is written out rather than wrapping
// labels.Parse.
func TestConsumerDoesNotDependOnApimachinery(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("go is not on PATH to list the dependencies of consumer: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps .: %v\n%s", err, stderr)
	}
	for dep := range strings.Lines(string(out)) {
		if strings.HasPrefix(dep, "k8s.io/") {
			t.Errorf("consumer depends on %s", strings.TrimSpace(dep))
		}
	}
}
