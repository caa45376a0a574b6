package benchrun

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Scrape reads the unlabelled series asked for, in any float format, and
// fails on a missing one.
func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# HELP payments_charge_batches_total Charge batches.\n"+
			"# TYPE payments_charge_batches_total counter\n"+
			"payments_charge_batches_total{shard=\"1\"} 7\n"+
			"payments_charge_batches_total 1.234567e+06\n"+
			"go_goroutines 12\n")
	}))
	defer srv.Close()
	ctx := context.Background()
	got, err := Scrape(ctx, srv.URL, "payments_charge_batches_total", "go_goroutines")
	if err != nil {
		t.Fatal(err)
	}
	if got["payments_charge_batches_total"] != 1234567 || got["go_goroutines"] != 12 {
		t.Errorf("Scrape = %v, want the unlabelled batches 1234567 and 12 goroutines", got)
	}
	if _, err := Scrape(ctx, srv.URL, "payments_missing_total"); err == nil || !strings.Contains(err.Error(), "payments_missing_total") {
		t.Errorf("Scrape of a missing series: %v, want an error naming it", err)
	}
}
