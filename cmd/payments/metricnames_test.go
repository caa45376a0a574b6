package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"go.yaml.in/yaml/v3"
)

// The files whose PromQL is checked against what the processes export.
const (
	alertsFile    = "../../deploy/prometheus/alerts.yml"
	dashboardFile = "../../deploy/grafana/payments.json"
)

// prometheusOwn are series Prometheus makes itself, not a target: they are not
// looked for in /metrics.
var prometheusOwn = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped",
	"scrape_samples_post_metric_relabeling", "scrape_series_added", "ALERTS", "ALERTS_FOR_STATE"}

// TestRulesAndDashboardNameExportedMetrics: every metric that a rule of
// deploy/prometheus/alerts.yml or a query of deploy/grafana/payments.json
// names is in the real /metrics of serve, relay or consume, started through
// run, after traffic that makes their labelled series appear (an account, a
// deposit, a charge, a refused charge and a replay). scripts/lint-metric-names.sh
// runs it in make lint.
func TestRulesAndDashboardNameExportedMetrics(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	account := s.account(1000)
	key := uuid.NewString()
	charged, replayed := s.charge(account, key, 250), s.charge(account, key, 250)
	refused := s.charge(account, uuid.NewString(), 5000)
	if charged != http.StatusCreated || replayed != http.StatusCreated || refused != http.StatusPaymentRequired {
		t.Fatalf("charge %d, its replay %d, a charge over the balance %d; want 201, 201, 402", charged, replayed, refused)
	}
	// account.created, deposit.created, charge.succeeded, charge.failed: once
	// the consumer has them, the relay has published them.
	s.waitForValue("consume", "payments_consumer_applied_total", 4)

	exported := map[string]bool{}
	for command := range s.scrape {
		for name := range exportedNames(s.metrics(command)) {
			exported[name] = true
		}
	}
	queries := ruleQueries(t, alertsFile)
	for where, q := range dashboardQueries(t, dashboardFile) {
		queries[where] = q
	}
	for _, where := range slices.Sorted(maps.Keys(queries)) {
		names, err := promqlMetricNames(queries[where])
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s names no metric: %q", where, queries[where])
		}
		for _, name := range names {
			if !exported[name] && !slices.Contains(prometheusOwn, name) {
				t.Errorf("%s names %s, which neither serve, relay nor consume exports:\n  %s", where, name, queries[where])
			}
		}
	}
	if len(queries) < 20 {
		t.Errorf("only %d queries read from %s and %s", len(queries), alertsFile, dashboardFile)
	}
}

// exportedNames returns the names of the samples in a scrape (a histogram's
// _bucket, _sum and _count each).
func exportedNames(text string) map[string]bool {
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]`).FindAllStringSubmatch(text, -1) {
		names[m[1]] = true
	}
	return names
}

// ruleQueries returns the expression of every rule in a Prometheus rules
// file, keyed by "file: rule name".
func ruleQueries(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	queries := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			queries[path+": "+r.Alert+r.Record] = r.Expr
		}
	}
	return queries
}

// labelValues matches a Grafana variable query label_values(expr, label).
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_]\w*\s*\)\s*$`)

// dashboardQueries returns every PromQL expression of a Grafana dashboard:
// its panels' targets (rows' panels included) and its query variables
// (the series of label_values(expr, label)), keyed by where they are.
func dashboardQueries(t *testing.T, path string) map[string]string {
	t.Helper()
	d := readDashboard(t, path)
	queries := map[string]string{}
	var walk func([]dashboardPanel)
	walk = func(panels []dashboardPanel) {
		for _, p := range panels {
			for _, target := range p.Targets {
				queries[path+": panel "+p.Title+" "+target.RefID] = target.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil { // older dashboards: a plain string
			_ = json.Unmarshal(v.Query, &q.Query)
		}
		expr := q.Query
		if m := labelValues.FindStringSubmatch(expr); m != nil {
			expr = m[1]
		}
		queries[path+": variable "+v.Name] = expr
	}
	return queries
}

// dashboard is what the tests read of a Grafana dashboard JSON model.
type dashboard struct {
	UID, Title    string
	SchemaVersion int
	Panels        []dashboardPanel
	Templating    struct {
		List []struct {
			Name, Type string
			Query      json.RawMessage
			Datasource json.RawMessage
		}
	}
}

type dashboardPanel struct {
	ID         int
	Type       string
	Title      string
	Datasource struct{ Type, UID string }
	GridPos    struct{ X, Y, W, H int }
	Targets    []struct {
		RefID      string
		Expr       string
		Datasource struct{ Type, UID string }
	}
	Panels []dashboardPanel
}

func readDashboard(t *testing.T, path string) dashboard {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

// TestDashboardIsImportable: the dashboard is a Grafana dashboard JSON model
// that imports into any Grafana with a Prometheus data source: a uid, a
// title and a schema version; a datasource variable of type prometheus that
// every panel and query uses (none is tied to one Grafana's data source
// uid); and panels with unique ids and refIds, inside Grafana's 24 columns,
// none overlapping another.
func TestDashboardIsImportable(t *testing.T) {
	d := readDashboard(t, dashboardFile)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
	}
	const ds = "${datasource}"
	var variable bool
	for _, v := range d.Templating.List {
		variable = variable || v.Name == "datasource" && v.Type == "datasource" && strings.Contains(string(v.Query), `"prometheus"`)
		if v.Type == "query" && !strings.Contains(string(v.Datasource), ds) {
			t.Errorf("variable %s queries %s, not %s", v.Name, v.Datasource, ds)
		}
	}
	if !variable {
		t.Error("no datasource variable named datasource of type prometheus")
	}
	ids := map[int]bool{}
	var boxes []dashboardPanel
	for _, p := range d.Panels {
		if ids[p.ID] || p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: duplicate id, no title or no query", p.ID, p.Title)
		}
		ids[p.ID] = true
		if p.Datasource.UID != ds || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q uses data source %+v, want the variable %s", p.Title, p.Datasource, ds)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.RefID == "" || refs[q.RefID] || q.Expr == "" || q.Datasource.UID != ds {
				t.Errorf("panel %q: query %q has a missing or duplicate refId, no expr, or data source %q", p.Title, q.RefID, q.Datasource.UID)
			}
			refs[q.RefID] = true
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q at %+v: outside Grafana's 24 columns", p.Title, g)
		}
		for _, o := range boxes {
			h := o.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panels %q and %q overlap", p.Title, o.Title)
			}
		}
		boxes = append(boxes, p)
	}
}
