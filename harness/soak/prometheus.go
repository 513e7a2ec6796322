package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// With Options.Prometheus the soak runs a real Prometheus server and a real
// Alertmanager as child processes: Prometheus scrapes the bridge every
// scrapeInterval and evaluates the shipped alerting rules, rendered on a
// clock AlertTimeScale times faster (rules.go); Alertmanager sends what
// fires to a webhook the soak serves (alerts.go).

// AlertTimeScale is how much faster than production the soak's copy of the
// alerting rules runs: a minute of the shipped rules is 2 s in the soak (a
// for: 5m waits 10 s, a rate over [15m] looks back 30 s, the 180 s of
// PlegBridgePLEGNotHealthy is 6 s). Faster would be shorter, but a clean
// soak on two busy cores then fires: the bridge starved of CPU for 3 s
// looks like a PLEG 3 minutes late, a full outbox for 5 s like one full
// for 5 minutes.
const AlertTimeScale = 30

// scrapeInterval is Prometheus' scrape and rule evaluation interval in the
// soak: short beside the scaled rules' times, long beside a scrape of the
// bridge (a few milliseconds).
const scrapeInterval = time.Second

// The versions the soak is written against, and the cache directories a
// fetch puts them in (docs/soak.md, .ci/run): Debian bookworm's prometheus
// and prometheus-alertmanager packages.
const (
	prometheusCacheDir   = "prometheus-2.42"
	alertmanagerCacheDir = "alertmanager-0.25"
)

// promStartTimeout bounds the wait for Prometheus or Alertmanager to be
// ready.
const promStartTimeout = time.Minute

// FindAlertingBinaries returns the prometheus and alertmanager executables:
// each from lookPath (exec.LookPath: prometheus; alertmanager, or Debian's
// prometheus-alertmanager), or else from cacheDir, where .ci/run puts the
// ones it takes from Debian's packages. Its error says how to get those
// that are missing.
func FindAlertingBinaries(lookPath func(string) (string, error), cacheDir string) (prometheus, alertmanager string, err error) {
	find := func(names []string, cached string) string {
		for _, n := range names {
			if p, err := lookPath(n); err == nil {
				return p
			}
		}
		if cacheDir != "" {
			if fi, err := os.Stat(cached); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				return cached
			}
		}
		return ""
	}
	prometheus = find([]string{"prometheus"}, filepath.Join(cacheDir, prometheusCacheDir, "prometheus"))
	alertmanager = find([]string{"alertmanager", "prometheus-alertmanager"}, filepath.Join(cacheDir, alertmanagerCacheDir, "alertmanager"))
	var missing []string
	if prometheus == "" {
		missing = append(missing, fmt.Sprintf("prometheus (not on PATH, nor %s)", filepath.Join(cacheDir, prometheusCacheDir, "prometheus")))
	}
	if alertmanager == "" {
		missing = append(missing, fmt.Sprintf("alertmanager (not on PATH as alertmanager or prometheus-alertmanager, nor %s)", filepath.Join(cacheDir, alertmanagerCacheDir, "alertmanager")))
	}
	if len(missing) > 0 {
		return "", "", fmt.Errorf("--prometheus needs %s: .ci/run fetches both into %s from Debian bookworm's prometheus and prometheus-alertmanager packages without installing them (docs/soak.md says how), or install Prometheus 2.42+ and Alertmanager 0.25+",
			strings.Join(missing, " and "), cacheDir)
	}
	return prometheus, alertmanager, nil
}

// promStack is the soak's Prometheus and Alertmanager, and the files that
// configure them. Its methods are called from the schedule's goroutine;
// query and alerts are safe for concurrent use.
type promStack struct {
	dir         string
	promURL     string
	amURL       string
	targetsFile string
	target      string // the bridge's host:port
	client      *http.Client
	prom, am    *proc.Process
}

// startChild starts binary with args, its output to logPath, in dir. Its
// stop is a SIGTERM, and a SIGKILL 10 s later.
func startChild(name, binary, dir, logPath string, args ...string) (*proc.Process, error) {
	p := proc.New(name, append([]string{binary}, args...), proc.Options{Dir: dir, LogPath: logPath, StopTimeout: 10 * time.Second})
	if err := p.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// promConfig is the parts of Prometheus' configuration the soak writes.
type promConfig struct {
	Global struct {
		ScrapeInterval     string `json:"scrape_interval"`
		ScrapeTimeout      string `json:"scrape_timeout"`
		EvaluationInterval string `json:"evaluation_interval"`
	} `json:"global"`
	RuleFiles []string `json:"rule_files"`
	Alerting  struct {
		Alertmanagers []staticTargets `json:"alertmanagers"`
	} `json:"alerting"`
	ScrapeConfigs []scrapeConfig `json:"scrape_configs"`
}

type staticTargets struct {
	StaticConfigs []targetGroup `json:"static_configs"`
}

type scrapeConfig struct {
	JobName       string         `json:"job_name"`
	FileSDConfigs []fileSDConfig `json:"file_sd_configs"`
}

type fileSDConfig struct {
	Files           []string `json:"files"`
	RefreshInterval string   `json:"refresh_interval"`
}

type targetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// startPromStack writes the configuration under dir and starts
// Alertmanager, then Prometheus, scraping target (the bridge's host:port)
// as the rules expect it (job pleg-bridge, a node label) and evaluating
// rules (the rendered rules file), with webhook as Alertmanager's only
// receiver. It returns once both answer /-/ready; on error it leaves
// nothing running.
func startPromStack(ctx context.Context, dir, prometheus, alertmanager string, rules []byte, target, webhook string) (_ *promStack, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start prometheus: %w", err)
	}
	p := &promStack{dir: dir, targetsFile: filepath.Join(dir, "targets.json"), target: target, client: &http.Client{Timeout: 10 * time.Second}}
	defer func() {
		if err != nil {
			p.stop()
		}
	}()
	amPort, err := freePort()
	if err != nil {
		return nil, err
	}
	promPort, err := freePort()
	if err != nil {
		return nil, err
	}
	p.amURL = "http://127.0.0.1:" + strconv.Itoa(amPort)
	p.promURL = "http://127.0.0.1:" + strconv.Itoa(promPort)

	// Every alert its own group, notified at once and on resolution; a
	// firing one is not repeated within a soak.
	amConfig := fmt.Sprintf(`route:
  receiver: soak
  group_by: ['...']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: soak
    webhook_configs:
      - url: %q
        send_resolved: true
`, webhook)
	amFile := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(amFile, []byte(amConfig), 0o644); err != nil {
		return nil, fmt.Errorf("write alertmanager config: %w", err)
	}
	rulesFile := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		return nil, fmt.Errorf("write rules: %w", err)
	}
	if err := p.setTarget(true); err != nil {
		return nil, err
	}
	var cfg promConfig
	cfg.Global.ScrapeInterval = scrapeInterval.String()
	cfg.Global.ScrapeTimeout = scrapeInterval.String()
	cfg.Global.EvaluationInterval = scrapeInterval.String()
	cfg.RuleFiles = []string{rulesFile}
	cfg.Alerting.Alertmanagers = []staticTargets{{StaticConfigs: []targetGroup{{Targets: []string{"127.0.0.1:" + strconv.Itoa(amPort)}}}}}
	cfg.ScrapeConfigs = []scrapeConfig{{JobName: "pleg-bridge", FileSDConfigs: []fileSDConfig{{Files: []string{p.targetsFile}, RefreshInterval: scrapeInterval.String()}}}}
	b, err := json.MarshalIndent(cfg, "", "  ") // JSON is YAML
	if err != nil {
		return nil, err
	}
	promFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(promFile, b, 0o644); err != nil {
		return nil, fmt.Errorf("write prometheus config: %w", err)
	}

	// Debian's alertmanager reads its notification templates from a
	// directory beside it; elsewhere the directory does not matter.
	if p.am, err = startChild("alertmanager", alertmanager, filepath.Dir(alertmanager), filepath.Join(dir, "alertmanager.log"),
		"--config.file="+amFile,
		"--storage.path="+filepath.Join(dir, "alertmanager-data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(amPort),
		"--cluster.listen-address=", // no gossip: one Alertmanager
	); err != nil {
		return nil, err
	}
	if err := p.waitReady(ctx, p.am, p.amURL); err != nil {
		return nil, err
	}
	if p.prom, err = startChild("prometheus", prometheus, dir, filepath.Join(dir, "prometheus.log"),
		"--config.file="+promFile,
		"--storage.tsdb.path="+filepath.Join(dir, "prometheus-data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(promPort),
		// Firing alerts are sent again this often; resolved ones at once.
		"--rules.alert.resend-delay="+scrapeInterval.String(),
	); err != nil {
		return nil, err
	}
	if err := p.waitReady(ctx, p.prom, p.promURL); err != nil {
		return nil, err
	}
	return p, nil
}

// setTarget writes the scrape targets: the bridge, or none (a bridge whose
// pod is gone). Prometheus watches the file; it is replaced in one rename,
// so Prometheus never reads half of it.
func (p *promStack) setTarget(present bool) error {
	groups := []targetGroup{}
	if present {
		groups = append(groups, targetGroup{Targets: []string{p.target}, Labels: map[string]string{"node": nodeName, "pod": "pleg-bridge-soak"}})
	}
	b, err := json.Marshal(groups)
	if err != nil {
		return err
	}
	tmp := p.targetsFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write scrape targets: %w", err)
	}
	if err := os.Rename(tmp, p.targetsFile); err != nil {
		return fmt.Errorf("write scrape targets: %w", err)
	}
	return nil
}

// waitReady polls base/-/ready until it answers 200, the process exits, or
// promStartTimeout passes.
func (p *promStack) waitReady(ctx context.Context, c *proc.Process, base string) error {
	deadline := time.Now().Add(promStartTimeout)
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/-/ready", nil)
		if err != nil {
			return err
		}
		if resp, err := p.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (log: %s)", c.Name(), promStartTimeout, c.LogPath())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.Done():
			return c.ExitError()
		case <-ticker.C:
		}
	}
}

// stop stops Prometheus, then Alertmanager.
func (p *promStack) stop() {
	for _, c := range []*proc.Process{p.prom, p.am} {
		if c != nil {
			_ = c.Stop(proc.Term) // the soak is over: how they ended does not matter
		}
	}
}

// promSeries is one series of a query's answer.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`  // instant query: [time, "value"]
	Values [][]any           `json:"values"` // range query
}

// query runs a PromQL query against Prometheus' HTTP API: an instant query
// at now if step is 0, else a range query from start to end. It returns the
// series of the answer, or the API's error.
func (p *promStack) query(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]promSeries, error) {
	v := url.Values{"query": {expr}}
	path := "/api/v1/query"
	if step > 0 {
		path = "/api/v1/query_range"
		v.Set("start", strconv.FormatFloat(float64(start.UnixMilli())/1000, 'f', 3, 64))
		v.Set("end", strconv.FormatFloat(float64(end.UnixMilli())/1000, 'f', 3, 64))
		v.Set("step", strconv.FormatFloat(step.Seconds(), 'f', 3, 64))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.promURL+path, strings.NewReader(v.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query prometheus: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("query prometheus: %w", err)
	}
	var ans struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, fmt.Errorf("query prometheus: %s: %w", resp.Status, err)
	}
	if ans.Status != "success" {
		return nil, errors.New(ans.Error)
	}
	var series []promSeries
	switch ans.Data.ResultType {
	case "vector", "matrix":
		if err := json.Unmarshal(ans.Data.Result, &series); err != nil {
			return nil, fmt.Errorf("query prometheus: %w", err)
		}
	case "scalar":
		series = []promSeries{{}}
	}
	return series, nil
}
