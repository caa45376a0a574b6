package payments

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// runbookBase is where every alerting rule's runbook_url points.
const runbookBase = "https://github.com/exactlyonce/payments/blob/main/docs/runbooks.md#"

// TestEveryAlertHasARunbook: every rule of deploy/prometheus/alerts.yml has
// a conventional severity (critical, warning, info) and a runbook_url naming
// its own section of docs/runbooks.md, which exists; and every section there
// is a rule's.
func TestEveryAlertHasARunbook(t *testing.T) {
	raw, err := os.ReadFile("deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	book, err := os.ReadFile("docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := regexp.MustCompile(`(?m)^## (\w+)$`).FindAllStringSubmatch(string(book), -1)
	var headings, alerts []string
	for _, s := range sections {
		headings = append(headings, s[1])
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if sev := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, sev) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, sev)
			}
			if got, want := r.Annotations["runbook_url"], runbookBase+strings.ToLower(r.Alert); got != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, got, want)
			}
			if !slices.Contains(headings, r.Alert) {
				t.Errorf("%s: no section ## %s in docs/runbooks.md", r.Alert, r.Alert)
			}
		}
	}
	for _, h := range headings {
		if !slices.Contains(alerts, h) {
			t.Errorf("docs/runbooks.md has a section for %s, which no rule is", h)
		}
	}
}
