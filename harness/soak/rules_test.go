package soak

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRenderRulesDividesEveryTimeByTheScale(t *testing.T) {
	shipped := []byte(`
groups:
  - name: g
    rules:
      - alert: Stale
        expr: time() - x_timestamp_seconds > 180
        for: 1m
        labels: {severity: critical}
      - alert: Slow
        expr: rate(d_seconds_sum[15m]) / rate(d_seconds_count[15m]) > 60
        for: 10m
      - alert: Failing
        expr: sum(rate(p_total{result="error"}[5m])) / sum(rate(p_total[5m])) > 0.5 and max_over_time(q[1h:1m]) > 0
        for: 1h
      - alert: NoFor
        expr: increase(d_total[15m]) > 0
      - record: r
        expr: sum(rate(e_total[10m]))
`)
	out, rules, err := renderRules(shipped, 60)
	if err != nil {
		t.Fatal(err)
	}
	want := []rule{
		{Alert: "Stale", Expr: "time() - x_timestamp_seconds > 3", For: "1s"},
		{Alert: "Slow", Expr: "rate(d_seconds_sum[15s]) / rate(d_seconds_count[15s]) > 1", For: "10s"},
		{Alert: "Failing", Expr: `sum(rate(p_total{result="error"}[5s])) / sum(rate(p_total[5s])) > 0.5 and max_over_time(q[1m:1s]) > 0`, For: "1m"},
		{Alert: "NoFor", Expr: "increase(d_total[15s]) > 0"},
	}
	if diff := cmp.Diff(want, rules); diff != "" {
		t.Errorf("rendered rules (-want +got):\n%s", diff)
	}
	for _, s := range []string{"severity: critical", "record: r", "sum(rate(e_total[10s]))"} {
		if !strings.Contains(string(out), s) {
			t.Errorf("rendered file lacks %q:\n%s", s, out)
		}
	}
}

func TestRenderRulesRefusesATimeBelowAMillisecond(t *testing.T) {
	_, _, err := renderRules([]byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(x[5ms]) > 0\n"), 60)
	if err == nil {
		t.Fatal("renderRules scaled 5ms by 60 without an error")
	}
}

// The shipped rules render: every for and every range scales, and no
// alert is lost on the way.
func TestRenderRulesTakesTheShippedFile(t *testing.T) {
	shipped, err := os.ReadFile("../../deploy/prometheus/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	_, rules, err := renderRules(shipped, AlertTimeScale)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(shipped), "- alert: "); len(rules) != n {
		t.Errorf("rendered %d alerts, the shipped file has %d", len(rules), n)
	}
	for _, r := range rules {
		if strings.Contains(r.Expr, "m]") || strings.Contains(r.Expr, "h]") {
			t.Errorf("%s: a range was not scaled: %s", r.Alert, r.Expr)
		}
	}
}
