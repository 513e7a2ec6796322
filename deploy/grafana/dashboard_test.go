// Package grafana holds the Grafana dashboard (pleg-bridge.json) and its
// test: that Grafana's HTTP API (POST /api/dashboards/db, or a provisioned
// file) takes the JSON model as it is, on any Grafana whose Prometheus
// data source has any uid.
package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// dashboardFile is the dashboard as shipped.
const dashboardFile = "pleg-bridge.json"

// datasourceRef is how a panel or a target must name its data source: the
// dashboard's datasource variable, never a uid of one Grafana.
const datasourceRef = "${datasource}"

// uidPattern is what Grafana accepts as a dashboard uid.
var uidPattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,40}$`)

// model is the part of Grafana's dashboard JSON model the API and the
// panels need.
type model struct {
	ID            any     `json:"id"`
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasource     `json:"datasource"`
}

type panel struct {
	ID         *int        `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	GridPos    *gridPos    `json:"gridPos"`
	Datasource *datasource `json:"datasource"`
	Targets    []target    `json:"targets"`
	Panels     []panel     `json:"panels"`
}

type gridPos struct {
	H, W, X, Y *int
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// readDashboard returns the shipped dashboard, parsed, and its raw JSON.
func readDashboard(t *testing.T) (model, []byte) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var m model
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s is not a JSON dashboard model: %v", dashboardFile, err)
	}
	return m, raw
}

// checkDashboard returns what Grafana's API would refuse in m, or what
// would leave a panel without data on a Grafana whose data source has
// another uid than the author's.
func checkDashboard(m model, raw []byte) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if m.Title == "" {
		bad("no title")
	}
	if !uidPattern.MatchString(m.UID) {
		bad("uid %q: Grafana wants 1 to 40 letters, digits, - or _", m.UID)
	}
	if m.ID != nil {
		// The API takes a dashboard with an id as an update of that
		// dashboard in its database, which another Grafana does not have.
		bad("id %v: a dashboard to import has none (null or absent)", m.ID)
	}
	if m.SchemaVersion < 36 {
		bad("schemaVersion %d: want 36 or later (data sources referenced by uid)", m.SchemaVersion)
	}
	dsVar := ""
	for _, v := range m.Templating.List {
		if v.Type == "datasource" {
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" {
				bad("variable %s: a datasource variable should query the prometheus plugin, got %s", v.Name, v.Query)
			}
			dsVar = v.Name
		}
	}
	if "${"+dsVar+"}" != datasourceRef {
		bad("templating: no variable named datasource of type datasource (got %q)", dsVar)
	}
	for _, v := range m.Templating.List {
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != datasourceRef) {
			bad("variable %s: its data source must be %s, got %+v", v.Name, datasourceRef, v.Datasource)
		}
	}
	if len(m.Panels) == 0 {
		bad("no panels")
	}
	ids := map[int]string{}
	var walk func(ps []panel, inRow string)
	walk = func(ps []panel, inRow string) {
		for _, p := range ps {
			name := fmt.Sprintf("panel %q", p.Title)
			if p.ID == nil {
				bad("%s: no id", name)
			} else if other, dup := ids[*p.ID]; dup {
				bad("%s: id %d is also %s's", name, *p.ID, other)
			} else {
				ids[*p.ID] = name
			}
			if p.Type == "" {
				bad("%s: no type", name)
			}
			switch g := p.GridPos; {
			case g == nil || g.H == nil || g.W == nil || g.X == nil || g.Y == nil:
				bad("%s: gridPos needs h, w, x and y", name)
			case *g.H < 1 || *g.W < 1 || *g.X < 0 || *g.Y < 0 || *g.X+*g.W > 24:
				bad("%s: gridPos %d,%d %dx%d is not within Grafana's 24 columns", name, *g.X, *g.Y, *g.W, *g.H)
			}
			if p.Type == "row" {
				if inRow != "" {
					bad("%s: a row inside row %s", name, inRow)
				}
				if len(p.Targets) > 0 {
					bad("%s: a row has no queries", name)
				}
				walk(p.Panels, p.Title)
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != datasourceRef || p.Datasource.Type != "prometheus" {
				bad("%s: data source must be {type: prometheus, uid: %s}, got %+v", name, datasourceRef, p.Datasource)
			}
			if len(p.Targets) == 0 {
				bad("%s: no targets", name)
			}
			refs := map[string]bool{}
			for _, t := range p.Targets {
				if t.RefID == "" || refs[t.RefID] {
					bad("%s: refId %q is empty or repeated", name, t.RefID)
				}
				refs[t.RefID] = true
				if strings.TrimSpace(t.Expr) == "" {
					bad("%s, query %s: no expr", name, t.RefID)
				}
				if t.Datasource != nil && t.Datasource.UID != datasourceRef {
					bad("%s, query %s: data source must be %s, got %+v", name, t.RefID, datasourceRef, t.Datasource)
				}
			}
		}
	}
	walk(m.Panels, "")
	// Wherever the model names a data source, it is by the variable: never
	// a uid or a name of the author's Grafana.
	var generic any
	if err := json.Unmarshal(raw, &generic); err != nil {
		bad("%v", err)
	}
	var visit func(path string, v any)
	visit = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if k == "datasource" && !strings.HasPrefix(path, ".templating") {
					switch ds := c.(type) {
					case string:
						if ds != datasourceRef {
							bad("%s.datasource: a hard-coded data source %q: want {uid: %s}", path, ds, datasourceRef)
						}
					case map[string]any:
						if ds["uid"] != datasourceRef {
							bad("%s.datasource: a hard-coded uid %q: want %s", path, ds["uid"], datasourceRef)
						}
					}
				}
				visit(path+"."+k, c)
			}
		case []any:
			for i, c := range v {
				visit(fmt.Sprintf("%s[%d]", path, i), c)
			}
		}
	}
	visit("", generic)
	if strings.Contains(string(raw), "${DS_") || strings.Contains(string(raw), `"__inputs"`) {
		bad("the model has import-dialog inputs (__inputs, ${DS_...}) that the API leaves unfilled")
	}
	return errs
}

func TestDashboardIsImportableByGrafanasAPI(t *testing.T) {
	m, raw := readDashboard(t)
	for _, e := range checkDashboard(m, raw) {
		t.Error(e)
	}
}

// The check finds what it is for: each change below to the shipped model
// is one Grafana would refuse, or one that empties panels elsewhere.
func TestDashboardCheckFindsEachFault(t *testing.T) {
	_, raw := readDashboard(t)
	tests := []struct {
		name   string
		change func(m map[string]any)
		want   string
	}{
		{"no title", func(m map[string]any) { delete(m, "title") }, "no title"},
		{"a uid Grafana refuses", func(m map[string]any) { m["uid"] = "pleg bridge!" }, "uid"},
		{"a database id", func(m map[string]any) { m["id"] = 7 }, "id 7"},
		{"an old schema", func(m map[string]any) { m["schemaVersion"] = 16 }, "schemaVersion"},
		{"no datasource variable", func(m map[string]any) {
			m["templating"].(map[string]any)["list"] = m["templating"].(map[string]any)["list"].([]any)[1:]
		}, "no variable named datasource"},
		{"a panel without gridPos", func(m map[string]any) { delete(panelAt(m, 1), "gridPos") }, "gridPos needs"},
		{"a panel without id", func(m map[string]any) { delete(panelAt(m, 1), "id") }, "no id"},
		{"a repeated panel id", func(m map[string]any) { panelAt(m, 2)["id"] = panelAt(m, 1)["id"] }, "is also"},
		{"a panel without type", func(m map[string]any) { delete(panelAt(m, 1), "type") }, "no type"},
		{"a panel without targets", func(m map[string]any) { delete(panelAt(m, 1), "targets") }, "no targets"},
		{"a hard-coded data source uid", func(m map[string]any) {
			panelAt(m, 1)["datasource"] = map[string]any{"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
		}, "P1809F7CD0C75ACF3"},
		{"a target with a hard-coded data source uid", func(m map[string]any) {
			panelAt(m, 1)["targets"].([]any)[0].(map[string]any)["datasource"] = map[string]any{"type": "prometheus", "uid": "abc"}
		}, `"abc"`},
		{"import inputs", func(m map[string]any) { m["__inputs"] = []any{map[string]any{"name": "DS_PROMETHEUS"}} }, "__inputs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var generic map[string]any
			if err := json.Unmarshal(raw, &generic); err != nil {
				t.Fatal(err)
			}
			tt.change(generic)
			changed, err := json.MarshalIndent(generic, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			var m model
			if err := json.Unmarshal(changed, &m); err != nil {
				t.Fatal(err)
			}
			errs := checkDashboard(m, changed)
			if !strings.Contains(strings.Join(errs, "\n"), tt.want) {
				t.Errorf("check found %q, want something containing %q", errs, tt.want)
			}
		})
	}
}

// panelAt returns the top-level panel i of a generic model.
func panelAt(m map[string]any, i int) map[string]any {
	return m["panels"].([]any)[i].(map[string]any)
}
