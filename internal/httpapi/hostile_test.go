package httpapi_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// TestInventedMethods: 1,000 requests without an API key, each with a made-up
// 1 KB method, add one series to the request histogram (method OTHER) and a
// short log line each, and nothing echoes the method; a second 1,000 add no
// series at all. Not parallel, so the heap it measures is its own.
func TestInventedMethods(t *testing.T) {
	f := setup(t)
	const (
		requests   = 1000
		methodSize = 1024
		filler     = "INVENTED"
	)
	series := func() int {
		return strings.Count(f.scrape(), "\npayments_http_request_duration_seconds_count{")
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	attack := func(round int) {
		t.Helper()
		for i := range requests {
			prefix := fmt.Sprintf("M%d-%d-", round, i)
			method := prefix + strings.Repeat(filler, (methodSize-len(prefix))/len(filler)+1)[:methodSize-len(prefix)]
			req, err := http.NewRequest(method, f.url+"/v1/charges", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req) // no API key
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusMethodNotAllowed || bytes.Contains(body, []byte(filler)) {
				t.Fatalf("%.20s… /v1/charges: %d %s (%v); want 405 without the method", method, resp.StatusCode, body, err)
			}
		}
	}

	seriesBefore, scrapeBefore, logBefore, heapBefore := series(), len(f.scrape()), len(f.logs.String()), heap()
	attack(1)
	seriesAfter, scrapeAfter, logAfter, heapAfter := series(), len(f.scrape()), len(f.logs.String()), heap()
	attack(2)
	seriesAgain := series()

	if seriesBefore != 0 || seriesAfter != 1 || seriesAgain != 1 {
		t.Errorf("request series: %d before, %d after 1,000 invented methods, %d after 1,000 more; want 0, 1, 1",
			seriesBefore, seriesAfter, seriesAgain)
	}
	if !strings.Contains(f.scrape(), `method="OTHER"`) {
		t.Error(`the requests are not counted under method="OTHER"`)
	}
	if grew := scrapeAfter - scrapeBefore; grew > 4<<10 {
		t.Errorf("the metrics grew by %d bytes, want at most 4 KiB (one histogram)", grew)
	}
	logs := f.logs.String()
	perRequest := (logAfter - logBefore) / requests
	if perRequest > 256 {
		t.Errorf("the log grew by %d bytes per request, want at most 256", perRequest)
	}
	for line := range strings.Lines(logs) {
		if strings.Contains(line, filler) {
			t.Fatalf("a log line carries the invented method: %.200s", line)
		}
	}
	if !strings.Contains(logs, `"method":"OTHER"`) {
		t.Error(`no access log line says "method":"OTHER"`)
	}
	grewHeap := int64(heapAfter) - int64(heapBefore)
	if grewHeap > 1<<20 {
		t.Errorf("the heap grew by %d bytes over 1,000 invented methods, want under 1 MiB", grewHeap)
	}
	t.Logf("series %d -> %d -> %d; metrics +%d bytes; log %d bytes per request; heap %+d bytes",
		seriesBefore, seriesAfter, seriesAgain, scrapeAfter-scrapeBefore, perRequest, grewHeap)
}
