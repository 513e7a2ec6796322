package main

// Validation of the alerting rules (deploy/prometheus/rules.yml and its
// PrometheusRule twin in deploy/kubernetes) and of the Grafana dashboard
// (deploy/grafana) against the code: the two rule files hold the same
// rules, each alert has a runbook in docs/alerts.md, promtool accepts the rules
// and passes their unit tests and parses the dashboard's queries, and every
// metric a query names is one the bridge exports, so that renaming a metric
// fails here rather than in an alert that never fires or an empty panel.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/statebucket"
)

// alertJob is the job label the rules select: the value of the label the
// PodMonitor's jobLabel names.
const alertJob = "pleg-bridge"

// runbookBase is where each alert's runbook_url points, followed by
// "#<alert name in lower case>", GitHub's anchor of the heading
// "### <alert name>" in docs/alerts.md's "Runbooks".
const runbookBase = "https://github.com/pleg-bridge/pleg-bridge/blob/main/docs/alerts.md"

// ruleGroups is a Prometheus rules file: what promtool check rules reads.
type ruleGroups struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string      `json:"name"`
	Interval string      `json:"interval,omitempty"`
	Rules    []alertRule `json:"rules"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// prometheusRule is the part of the Prometheus Operator's PrometheusRule
// the manifest uses.
type prometheusRule struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            ruleGroups        `json:"spec"`
}

// loadRules decodes deploy/prometheus/rules.yml strictly.
func loadRules(t *testing.T) ruleGroups {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "prometheus", "rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rg ruleGroups
	if err := yaml.UnmarshalStrict(b, &rg); err != nil {
		t.Fatalf("deploy/prometheus/rules.yml does not decode strictly as a rules file: %v", err)
	}
	if len(rg.Groups) == 0 {
		t.Fatal("deploy/prometheus/rules.yml has no rule groups")
	}
	return rg
}

func TestEveryAlertHasASeverityASummaryAndARunbook(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "alerts.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The headings of docs/alerts.md's "Runbooks" section.
	_, section, ok := strings.Cut(string(page), "\n## Runbooks\n")
	if !ok {
		t.Fatal(`docs/alerts.md has no section "## Runbooks"`)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	runbooks := map[string]bool{}
	for line := range strings.Lines(section) {
		if name, ok := strings.CutPrefix(line, "### "); ok {
			runbooks[strings.TrimSpace(name)] = true
		}
	}

	seen := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s has a rule that is not an alert: %+v", g.Name, r)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("alert %s is defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if !strings.HasPrefix(r.Alert, "PlegBridge") {
				t.Errorf("alert %s lacks the PlegBridge prefix", r.Alert)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s has severity %q, want critical or warning", r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, a)
				}
			}
			if want := runbookBase + "#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("alert %s has runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !runbooks[r.Alert] {
				t.Errorf(`alert %s has no runbook: docs/alerts.md's "Runbooks" lacks "### %s"`, r.Alert, r.Alert)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("alert %s: for %q: %v", r.Alert, r.For, err)
				}
			}
		}
	}
	for name := range runbooks {
		if !seen[name] {
			t.Errorf("docs/alerts.md has a runbook for %s, which no rule defines", name)
		}
	}
}

// promtool returns the path of promtool. Without it the test is skipped on
// a developer's machine, and fails where CI is set: CI must run the rules'
// unit tests (.ci/run installs promtool).
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "false" {
		t.Fatalf("promtool not found with CI=%s: %v (.ci/run fetches it from Debian's prometheus package)", ci, err)
	}
	t.Skipf("promtool not found (%v); Debian's prometheus package has it, and with CI set this fails", err)
	return ""
}

func TestAlertRulesPassPromtoolCheckAndTheirUnitTests(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	dir := filepath.Join(repoRoot(t), "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "rules.yml"},
		{"test", "rules", "rules_test.yml"},
	} {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s in deploy/prometheus: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// --- metric names ---

// externalMetrics are the metrics the rules and the dashboard read that
// the bridge does not export, with where they come from.
var externalMetrics = map[string]string{
	"up": "Prometheus, for every target",
	"kube_daemonset_status_desired_number_scheduled": "kube-state-metrics",
	"kube_daemonset_status_number_available":         "kube-state-metrics",
}

// exportedMetrics are the names of every metric the bridge's /metrics
// serves, and which of them are histograms (or summaries), read from the
// descriptors of the collectors the bridge registers: Gather would miss a
// vector none of whose series exists yet. The collectors are built by the
// constructors bridge.build calls, each with the option that gives it all
// its metrics (a spool, a state bucket), and the runtime collectors
// runAgent adds; a component whose metrics are missing here makes the test
// fail on a name it does not know, never pass in silence.
func exportedMetrics(t *testing.T) (names, histograms map[string]bool) {
	t.Helper()
	rec := &descRecorder{reg: prometheus.NewRegistry(), names: map[string]bool{}, histograms: map[string]bool{}}

	rec.MustRegister(runtimeCollectors()...)
	generator.NewMetrics(rec)

	store, err := datadir.Open(t.TempDir(), datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: schemas.DefaultSubjectPrefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := publish.New(js.Conn(), publish.Options{Encoder: enc, Spool: store.Spool(), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := statebucket.New(js, statebucket.Options{Encoder: enc, Bucket: "pleg-state", Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if rec.err != nil {
		t.Fatal(rec.err)
	}
	return rec.names, rec.histograms
}

// descRecorder is a prometheus.Registerer that registers on reg (so that a
// duplicate or inconsistent metric still fails) and records the name of
// every descriptor.
type descRecorder struct {
	reg               *prometheus.Registry
	names, histograms map[string]bool
	err               error // the first descriptor whose name could not be read
}

// descName reads the fully-qualified name out of a Desc, which has no
// accessor for it.
var descName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

func (r *descRecorder) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	var histogram bool
	switch c.(type) {
	case prometheus.Histogram, *prometheus.HistogramVec, *prometheus.SummaryVec:
		histogram = true
	}
	descs := make(chan *prometheus.Desc)
	go func() {
		c.Describe(descs)
		close(descs)
	}()
	for d := range descs {
		m := descName.FindStringSubmatch(d.String())
		if m == nil {
			if r.err == nil {
				r.err = fmt.Errorf("no name in descriptor %s", d)
			}
			continue
		}
		r.names[m[1]] = true
		if histogram {
			r.histograms[m[1]] = true
		}
	}
	return nil
}

func (r *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *descRecorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// knownMetric reports whether name is exported, or is the _bucket, _sum or
// _count series of an exported histogram.
func knownMetric(name string, names, histograms map[string]bool) bool {
	if names[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && histograms[base] {
			return true
		}
	}
	return false
}

// promqlKeywords are the words of PromQL that can stand where a metric name
// could: aggregation operators (before by/without), set and comparison
// modifiers, and literals.
var promqlKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "start": true, "end": true,
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// promqlMetricNames returns the metric names a PromQL expression selects,
// in order, with Grafana's $variables allowed anywhere. It is a lexer, not
// a parser: it skips strings, label matchers ({...}), ranges ([...]),
// numbers and durations, and label lists after by, without, on, ignoring,
// group_left and group_right; an identifier left that is not a function
// call or a keyword is a metric name.
func promqlMetricNames(expr string) []string {
	var names []string
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || '0' <= c && c <= '9' }
	// skipTo returns the index after the closing byte of the bracket at i,
	// stepping over strings inside.
	skipTo := func(i int, closing byte) int {
		for i++; i < len(expr) && expr[i] != closing; i++ {
			if q := expr[i]; q == '"' || q == '\'' || q == '`' {
				for i++; i < len(expr) && expr[i] != q; i++ {
					if expr[i] == '\\' && q != '`' {
						i++
					}
				}
			}
		}
		return i + 1
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipTo(i, c)
		case c == '{':
			i = skipTo(i, '}')
		case c == '[':
			i = skipTo(i, ']')
		case c == '$' || '0' <= c && c <= '9' || c == '.':
			// A Grafana variable, a number or a duration.
			for i++; i < len(expr) && (isIdent(expr[i]) || expr[i] == '.'); i++ {
			}
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			next := i
			for next < len(expr) && (expr[next] == ' ' || expr[next] == '\n' || expr[next] == '\t') {
				next++
			}
			switch {
			case labelListKeywords[word] && next < len(expr) && expr[next] == '(':
				i = skipTo(next, ')')
			case promqlKeywords[word]:
			case next < len(expr) && expr[next] == '(':
				// A function call.
			default:
				names = append(names, word)
			}
		default:
			i++
		}
	}
	return names
}

func TestPromQLMetricNamesFindsTheSelectorsOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, expr string
		want       []string
	}{
		{"a bare selector is a name", `up`, []string{"up"}},
		{"label matchers, strings and ranges are skipped",
			`rate(pleg_bridge_publish_total{result="error", node=~"$node"}[$__rate_interval])`,
			[]string{"pleg_bridge_publish_total"}},
		{"numbers, durations and functions are skipped",
			`time() - pleg_bridge_last_relist_timestamp_seconds > 1.8e2 offset 5m`,
			[]string{"pleg_bridge_last_relist_timestamp_seconds"}},
		{"label lists after aggregations and matching are skipped",
			`sum without (event_type) (increase(a_total[15m])) > 0 unless on (node, job) b == 1 and ignoring(mode) c`,
			[]string{"a_total", "b", "c"}},
		{"a histogram quantile names the bucket series",
			`histogram_quantile(0.99, sum by (le, node) (rate(pleg_bridge_relist_duration_seconds_bucket[5m])))`,
			[]string{"pleg_bridge_relist_duration_seconds_bucket"}},
		{"a quoted brace in a matcher does not end it", `x{a="}b"} + y`, []string{"x", "y"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if diff := cmp.Diff(c.want, promqlMetricNames(c.expr)); diff != "" {
				t.Errorf("promqlMetricNames(%q) (-want +got):\n%s", c.expr, diff)
			}
		})
	}
}

// dashboardQueries returns the PromQL of every panel target and every
// query variable of the Grafana dashboard, keyed by where it is.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "grafana", "pleg-bridge.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"` // a collapsed row's
	}
	var d struct {
		UID        string            `json:"uid"`
		Title      string            `json:"title"`
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/pleg-bridge.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("the dashboard has uid %q and title %q; both must be set", d.UID, d.Title)
	}
	queries := map[string]string{}
	ids := map[int]bool{}
	var walk func([]json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("a panel of the dashboard: %v", err)
			}
			if ids[p.ID] {
				t.Errorf("panel id %d is used twice", p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				queries[fmt.Sprintf("panel %q, query %s", p.Title, tg.RefID)] = tg.Expr
			}
		}
	}
	walk(d.Panels)
	// label_values(<selector>, <label>) is Grafana's; its selector is PromQL.
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		if sm := labelValues.FindStringSubmatch(q); sm != nil {
			q = sm[1]
		}
		queries[fmt.Sprintf("variable %s", v.Name)] = q
	}
	return queries
}

func TestDashboardAndAlertsNameOnlyMetricsTheBridgeExports(t *testing.T) {
	t.Parallel()
	names, histograms := exportedMetrics(t)
	// The test is not vacuous: the registry holds what the README promises.
	for _, n := range []string{"pleg_bridge_last_relist_timestamp_seconds", "pleg_bridge_publish_total", "pleg_bridge_spool_bytes", "pleg_bridge_state_writes_total"} {
		if !names[n] {
			t.Fatalf("the bridge's registry lacks %s: the test builds it wrong", n)
		}
	}
	if !histograms["pleg_bridge_relist_duration_seconds"] {
		t.Fatal("pleg_bridge_relist_duration_seconds is not recognised as a histogram")
	}

	queries := dashboardQueries(t)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			queries["alert "+r.Alert] = r.Expr
		}
	}
	used := map[string]bool{}
	for where, expr := range queries {
		found := promqlMetricNames(expr)
		if len(found) == 0 {
			t.Errorf("%s names no metric: %q", where, expr)
		}
		for _, n := range found {
			used[n] = true
			if _, ok := externalMetrics[n]; ok || knownMetric(n, names, histograms) {
				continue
			}
			t.Errorf("%s uses %s, which the bridge does not export: %q", where, n, expr)
		}
	}
	for n, from := range externalMetrics {
		if !used[n] {
			t.Errorf("externalMetrics lists %s (%s), which nothing uses any more", n, from)
		}
	}
	// The dashboard shows what the alerts are about.
	var missing []string
	for _, n := range []string{
		"pleg_bridge_last_relist_timestamp_seconds", "pleg_bridge_relist_duration_seconds_bucket",
		"pleg_bridge_events_total", "pleg_bridge_publish_total", "pleg_bridge_publish_ack_duration_seconds_bucket",
		"pleg_bridge_outbox_events", "pleg_bridge_spool_bytes", "pleg_bridge_cri_stream_connected", "pleg_bridge_mode",
	} {
		inDashboard := false
		for where, expr := range queries {
			if !strings.HasPrefix(where, "alert ") && slices.Contains(promqlMetricNames(expr), n) {
				inDashboard = true
			}
		}
		if !inDashboard {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Errorf("the dashboard has no panel on %s", strings.Join(missing, ", "))
	}
}

// grafanaVariables stand in for the dashboard's variables, to make its
// queries PromQL.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "2m", "$__range", "6h", "$__interval", "1m", "$node", ".*")

func TestDashboardQueriesParseAsPromQL(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	// promtool parses the expressions of recording rules: one per query.
	var rules []map[string]string
	for where, expr := range dashboardQueries(t) {
		rules = append(rules, map[string]string{
			"record": fmt.Sprintf("dashboard:query_%d", len(rules)),
			"expr":   grafanaVariables.Replace(expr),
		})
		t.Logf("dashboard:query_%d is %s", len(rules)-1, where)
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard.yml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), bin, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}
