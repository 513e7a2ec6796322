package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The Grafana dashboard (deploy/grafana/pleg-bridge.json) must answer: at
// the end of a soak with Prometheus, each query of each panel runs against
// the soak's Prometheus over the whole run, with the dashboard's variables
// replaced as Grafana would, and must return at least one series.

// dashboardQuery is one target of one panel.
type dashboardQuery struct {
	Panel string // the panel's title, with its id
	RefID string
	Expr  string
}

// dashboardModel is the part of Grafana's JSON model the soak reads.
type dashboardModel struct {
	Panels []dashboardPanel `json:"panels"`
}

type dashboardPanel struct {
	ID      int              `json:"id"`
	Title   string           `json:"title"`
	Panels  []dashboardPanel `json:"panels"` // a collapsed row's
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// parseDashboard returns every query of a dashboard's panels, rows'
// panels included, in the dashboard's order.
func parseDashboard(model []byte) ([]dashboardQuery, error) {
	var d dashboardModel
	if err := json.Unmarshal(model, &d); err != nil {
		return nil, fmt.Errorf("parse dashboard: %w", err)
	}
	var out []dashboardQuery
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				if t.Expr != "" {
					out = append(out, dashboardQuery{Panel: fmt.Sprintf("%q (id %d)", p.Title, p.ID), RefID: t.RefID, Expr: t.Expr})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(out) == 0 {
		return nil, fmt.Errorf("parse dashboard: no panel has a query")
	}
	return out, nil
}

// grafanaInterpolate replaces the dashboard's variables as Grafana does
// for a query over rng with Prometheus scraping every scrape: the node
// variable is "All" (.*), $__rate_interval is four scrape intervals
// (Grafana's least), $__interval one, $__range the whole range.
func grafanaInterpolate(expr string, rng, scrape time.Duration) string {
	secs := func(d time.Duration) string { return fmt.Sprintf("%ds", int(d.Round(time.Second).Seconds())) }
	r := strings.NewReplacer(
		"$__rate_interval", secs(4*scrape),
		"${__rate_interval}", secs(4*scrape),
		"$__interval_ms", fmt.Sprint(scrape.Milliseconds()),
		"$__interval", secs(scrape),
		"${__interval}", secs(scrape),
		"$__range_s", fmt.Sprint(int(rng.Seconds())),
		"$__range", secs(rng),
		"${__range}", secs(rng),
		"${node:regex}", ".*",
		"${node}", ".*",
		"[[node]]", ".*",
		"$node", ".*",
	)
	return r.Replace(expr)
}

// PanelResult is one dashboard query's answer in the soak's Prometheus.
type PanelResult struct {
	Panel  string
	RefID  string
	Expr   string // as run, variables replaced
	Series int
	Err    string
}

// checkDashboard runs every query from start to end and returns their
// results.
func (p *promStack) checkDashboard(ctx context.Context, queries []dashboardQuery, start, end time.Time) []PanelResult {
	var out []PanelResult
	step := max(scrapeInterval, end.Sub(start)/300)
	for _, q := range queries {
		expr := grafanaInterpolate(q.Expr, end.Sub(start), scrapeInterval)
		res := PanelResult{Panel: q.Panel, RefID: q.RefID, Expr: expr}
		series, err := p.query(ctx, expr, start, end, step)
		if err != nil {
			res.Err = err.Error()
		}
		res.Series = len(series)
		out = append(out, res)
	}
	return out
}
