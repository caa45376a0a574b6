package benchrun

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// Scrape reads the unlabelled series names from GET metricsURL/metrics (a
// Service's MetricsURL). It fails when /metrics does not answer 200 or
// lacks one of them.
func Scrape(ctx context.Context, metricsURL string, names ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	values := make([]float64, len(names))
	targets := make(map[string]*float64, len(names))
	for i, name := range names {
		targets[name] = &values[i]
	}
	seen, err := readSeries(resp.Body, targets)
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(names))
	for i, name := range names {
		if !seen[name] {
			return nil, fmt.Errorf("/metrics has no %s", name)
		}
		out[name] = values[i]
	}
	return out, nil
}
