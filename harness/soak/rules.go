package soak

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// The shipped alerting rules (deploy/prometheus/rules.yml) wait minutes
// before they fire, as production needs; a soak of a few minutes cannot.
// renderRules makes the soak's copy of them from the shipped file, with
// every time in them divided by one factor, so that the rules the soak
// checks are the shipped ones on a faster clock, never a hand-kept second
// copy.

// rule is one alerting rule, with its times as the shipped file says.
type rule struct {
	Alert string `json:"alert"`
	Expr  string `json:"expr"`
	For   string `json:"for"`
}

// rangeSelector matches a PromQL range or subquery duration: "[5m]",
// "[1h30m]", "[10m:1m]".
var rangeSelector = regexp.MustCompile(`\[([0-9a-z]+)(?::([0-9a-z]*))?\]`)

// secondsThreshold matches a comparison with a number. In an expression
// over a metric in seconds (a name with "_seconds" in it: a point in time
// or a duration) the number is a time in seconds too: the 180 of
// time() - pleg_bridge_last_relist_timestamp_seconds > 180.
var secondsThreshold = regexp.MustCompile(`(>=|<=|==|!=|>|<)(\s*)([0-9]+(?:\.[0-9]+)?)\b`)

// renderRules returns the rules file shipped with every time in it divided
// by scale: each rule's for, each range in an expression ([5m]), and the
// thresholds of expressions over a metric in seconds. It also returns the
// rules, rendered. It fails on a time it cannot parse, or one that would
// scale below a millisecond.
func renderRules(shipped []byte, scale int) ([]byte, []rule, error) {
	if scale < 1 {
		return nil, nil, fmt.Errorf("scale rules: scale %d is below 1", scale)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(shipped, &doc); err != nil {
		return nil, nil, fmt.Errorf("parse rules: %w", err)
	}
	groups, _ := doc["groups"].([]any)
	if len(groups) == 0 {
		return nil, nil, fmt.Errorf("parse rules: no groups")
	}
	var rules []rule
	for _, g := range groups {
		gm, _ := g.(map[string]any)
		rs, _ := gm["rules"].([]any)
		for _, r := range rs {
			rm, ok := r.(map[string]any)
			if !ok {
				return nil, nil, fmt.Errorf("parse rules: a rule of group %v is not a map", gm["name"])
			}
			name, _ := rm["alert"].(string)
			if name == "" {
				name, _ = rm["record"].(string)
			}
			expr, _ := rm["expr"].(string)
			scaled, err := scaleExpr(expr, scale)
			if err != nil {
				return nil, nil, fmt.Errorf("rule %s: %w", name, err)
			}
			rm["expr"] = scaled
			out := rule{Alert: name, Expr: scaled}
			if f, ok := rm["for"].(string); ok {
				d, err := scaleDuration(f, scale)
				if err != nil {
					return nil, nil, fmt.Errorf("rule %s: for: %w", name, err)
				}
				rm["for"], out.For = d, d
			}
			if _, ok := rm["alert"]; ok {
				rules = append(rules, out)
			}
		}
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("render rules: %w", err)
	}
	return b, rules, nil
}

// scaleExpr divides the ranges of a PromQL expression by scale, and the
// numbers it compares with when it reads a metric in seconds.
func scaleExpr(expr string, scale int) (string, error) {
	var errs []string
	out := rangeSelector.ReplaceAllStringFunc(expr, func(m string) string {
		sub := rangeSelector.FindStringSubmatch(m)
		r, err := scaleDuration(sub[1], scale)
		if err != nil {
			errs = append(errs, err.Error())
			return m
		}
		if !strings.Contains(m, ":") {
			return "[" + r + "]"
		}
		step := ""
		if sub[2] != "" {
			if step, err = scaleDuration(sub[2], scale); err != nil {
				errs = append(errs, err.Error())
				return m
			}
		}
		return "[" + r + ":" + step + "]"
	})
	if strings.Contains(out, "_seconds") {
		out = secondsThreshold.ReplaceAllStringFunc(out, func(m string) string {
			sub := secondsThreshold.FindStringSubmatch(m)
			v, err := strconv.ParseFloat(sub[3], 64)
			if err != nil {
				errs = append(errs, err.Error())
				return m
			}
			return sub[1] + sub[2] + strconv.FormatFloat(v/float64(scale), 'g', -1, 64)
		})
	}
	if len(errs) > 0 {
		return "", fmt.Errorf("scale expression: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// scaleDuration divides a Prometheus duration ("5m", "1h30m") by scale and
// writes it back in Prometheus' form.
func scaleDuration(s string, scale int) (string, error) {
	d, err := model.ParseDuration(s)
	if err != nil {
		return "", err
	}
	scaled := time.Duration(d) / time.Duration(scale)
	if d != 0 && scaled < time.Millisecond {
		return "", fmt.Errorf("%s divided by %d is below a millisecond", s, scale)
	}
	return model.Duration(scaled.Truncate(time.Millisecond)).String(), nil
}

// duration parses a rendered rule's time; "" is 0.
func duration(s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := model.ParseDuration(s)
	if err != nil {
		return 0 // rendered by scaleDuration: always valid
	}
	return time.Duration(d)
}
