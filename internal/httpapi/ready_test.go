package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestReadyzLogsStateChanges: probed 30 times while its database refuses
// every connection, /readyz answers 503 each time and logs one WARN (ready →
// not ready, with the reason), no ERROR; a charge refused meanwhile is logged
// at INFO with its request id and cause, since /readyz has reported the
// outage; the first probe that finds the database back logs one INFO with the
// failed probes counted, and the next ones nothing.
func TestReadyzLogsStateChanges(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	f := setup(t, func(o *setupOptions) { o.databaseURL = url })
	acct := f.account("USD", 1000)
	if r := f.get("/readyz"); r.status != http.StatusOK {
		t.Fatalf("/readyz before the outage: %d %s", r.status, r.body)
	}
	db := testkit.NewDatabaseSwitch(t, pgtest.AdminURL(t), url)
	f.get("/v1/accounts/" + acct) // the API key is trusted for 1 s from here
	before := len(f.logs.String())
	since := func(msg string) []testkit.LogLine { return testkit.JSONLog(t, f.logs.String()[before:], msg) }

	probe := func(i int) {
		t.Helper()
		if r := f.get("/readyz"); r.status != http.StatusServiceUnavailable || r.code(t) != "service-unavailable" {
			t.Fatalf("probe %d with the database cut off: %d %s", i, r.status, r.body)
		}
	}
	db.Cut()
	probe(0)
	// At once, while the API key is still trusted without a lookup.
	charge := f.post("/v1/charges", uuid.NewString(), chargeBody(acct, 100))
	keyLookup := charge.status == http.StatusInternalServerError &&
		len(testkit.Where(since("request failed"), "request_id", charge.header.Get(httpapi.RequestIDHeader))) == 1 &&
		strings.Contains(f.logs.String()[before:], "look up API key")
	switch {
	case keyLookup:
		// The key's trust ran out first (a slow machine): its lookup's
		// connection error is a 500 (internal/postgres's classification,
		// not this test's subject), logged at ERROR.
		t.Log("the API key was looked up again: the refused charge's line is not checked")
	case charge.status != http.StatusServiceUnavailable:
		t.Fatalf("a charge with the database cut off: %d %s", charge.status, charge.body)
	}
	const probes = 30
	for i := 1; i < probes; i++ {
		probe(i)
	}
	db.Restore()
	ready := false
	for deadline := time.Now().Add(30 * time.Second); !ready && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ready = f.get("/readyz").status == http.StatusOK
	}
	if !ready {
		t.Fatal("/readyz did not answer 200 within 30 s of the database's return")
	}
	for range 5 {
		f.get("/readyz")
	}

	all := since("")
	if keyLookup {
		all = testkit.Where(all, "msg", "readiness")
	}
	if warns := testkit.Where(all, "level", "WARN", "ERROR"); len(warns) != 1 || warns[0]["msg"] != "readiness" || warns[0]["state"] != "down" ||
		warns[0]["error"] == "" {
		t.Errorf("%d WARN/ERROR lines for %d failed probes and a refused charge, want one (readiness down, with the reason): %v", len(warns), probes, warns)
	}
	ups := testkit.Where(since("readiness"), "state", "up")
	if len(ups) != 1 || ups[0]["level"] != "INFO" || ups[0]["attempts"].(float64) < probes {
		t.Errorf("readiness back up: %v, want one INFO line counting at least %d failed probes", ups, probes)
	}
	failed := testkit.Where(since("request failed"), "request_id", charge.header.Get(httpapi.RequestIDHeader))
	if !keyLookup && (len(failed) != 1 || failed[0]["level"] != "INFO" || failed[0]["error"] == "") {
		t.Errorf("the refused charge's line: %v, want one at INFO with its cause", failed)
	}
}
