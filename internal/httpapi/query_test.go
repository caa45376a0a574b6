package httpapi_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/httpapi"
)

// TestUnknownQueryParametersAreRefused: on every route, a query parameter the
// operation does not take is a 400 invalid-request naming it (in detail and
// field), and nothing happens: a POST so refused moves no money, stores no
// key, and its key then executes the request sent without the parameter.
func TestUnknownQueryParametersAreRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	charge := f.charge(acct, 100)
	refund := f.post("/v1/charges/"+charge+"/refunds", uuid.NewString(), `{"amount":10}`)
	deposit := f.post("/v1/accounts/"+acct+"/deposits", uuid.NewString(), `{"amount":10}`)
	if refund.status != http.StatusCreated || deposit.status != http.StatusCreated {
		t.Fatalf("refund %d %s, deposit %d %s", refund.status, refund.body, deposit.status, deposit.body)
	}
	gets := []string{
		"/v1/accounts/" + acct,
		deposit.header.Get("Location"),
		"/v1/charges",
		"/v1/charges/" + charge,
		refund.header.Get("Location"),
		"/v1/events",
		"/healthz", "/readyz", "/openapi.yaml", "/problems/not-found",
	}
	posts := []struct{ path, body string }{
		{"/v1/accounts", `{"currency":"USD"}`},
		{"/v1/accounts/" + acct + "/deposits", `{"amount":7}`},
		{"/v1/charges", chargeBody(acct, 7)},
		{"/v1/charges/" + charge + "/refunds", `{"amount":7}`},
	}
	type counts struct{ keys, accounts, deposits, charges, refunds, events int }
	count := func() counts {
		q := func(table string) int { return f.count(`SELECT count(*) FROM ` + table + ` WHERE merchant_id = $1`) }
		return counts{f.keys(), q("accounts"), q("deposits"), q("charges"), q("refunds"), q("events")}
	}
	before, balance := count(), f.balance(acct)

	for _, query := range []string{"expand=x", "limit=5&expand=", "Limit=5", "expand"} {
		for _, path := range gets {
			f.refusesParameter(f.request(http.MethodGet, path+"?"+query, "", ""), "GET "+path+"?"+query)
		}
		for _, p := range posts {
			f.refusesParameter(f.request(http.MethodPost, p.path+"?"+query, uuid.NewString(), p.body), "POST "+p.path+"?"+query)
		}
	}
	if after := count(); after != before || f.balance(acct) != balance {
		t.Fatalf("refused requests changed something: %+v, balance %d; before %+v, balance %d", after, f.balance(acct), before, balance)
	}

	// A refused POST's key is free: the same key, without the parameter, executes.
	for _, p := range posts {
		key := uuid.NewString()
		f.refusesParameter(f.request(http.MethodPost, p.path+"?expand=x", key, p.body), "POST "+p.path+"?expand=x")
		if r := f.post(p.path, key, p.body); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("POST %s with the refused request's key: %d %s (Idempotent-Replayed %q), want a first 201",
				p.path, r.status, r.body, r.header.Get("Idempotent-Replayed"))
		}
	}
	f.checkLedger(acct)
}

// refusesParameter sends req, whose query names expand, Limit or an empty
// value of expand, and asserts the 400 that names it.
func (f *fixture) refusesParameter(req *http.Request, what string) {
	f.t.Helper()
	r := f.do(req)
	if r.status != http.StatusBadRequest || r.code(f.t) != "invalid-request" {
		f.t.Errorf("%s = %d %s, want 400 invalid-request", what, r.status, r.body)
		return
	}
	p := r.json(f.t)
	field, _ := p["field"].(string)
	detail, _ := p["detail"].(string)
	if !slices.Contains([]string{"expand", "Limit"}, field) || !strings.Contains(detail, `"`+field+`"`) {
		f.t.Errorf("%s: field %q, detail %q; want the unknown parameter named in both", what, field, detail)
	}
}

// TestQueryParametersOnceAndWellFormed: a parameter an operation takes is
// refused when given twice (which one would count is a guess) and a query
// string that does not parse is refused whole; an empty query is no query.
func TestQueryParametersOnceAndWellFormed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, c := range []struct {
		path, field string
		status      int
	}{
		{"/v1/charges?limit=1&limit=2", "limit", 400},
		{"/v1/events?starting_after=evt_00000000000000000000000000000001&starting_after=evt_00000000000000000000000000000002", "starting_after", 400},
		{"/v1/charges?limit=%zz", "", 400},
		{"/v1/charges?limit=1;expand=x", "", 400},
		{"/v1/charges?", "", 200},
		{"/v1/charges?&", "", 200},
		{"/v1/charges?limit=2&", "", 200},
	} {
		r := f.get(c.path)
		if r.status != c.status {
			t.Errorf("GET %s = %d %s, want %d", c.path, r.status, r.body, c.status)
			continue
		}
		if c.status != 400 {
			continue
		}
		p := r.json(t)
		if r.code(t) != "invalid-request" || p["detail"] == "" || (c.field != "" && p["field"] != c.field) {
			t.Errorf("GET %s = %s, want invalid-request naming %q", c.path, r.body, c.field)
		}
	}
}

// TestDocsTakeNoQueryParameters: the documentation page is a route like any
// other.
func TestDocsTakeNoQueryParameters(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.New(nil, slog.New(slog.NewTextHandler(io.Discard, nil)), httpapi.Options{Docs: true}))
	defer srv.Close()
	for path, want := range map[string]int{"/docs": 200, "/docs/": 200, "/docs?expand=x": 400, "/docs/init.js?v=1": 400} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 400 && !strings.Contains(string(body), `"field":"`)) {
			t.Errorf("GET %s = %d %s, want %d", path, resp.StatusCode, body, want)
		}
	}
}

// TestRoutesTakeTheSpecsParameters: the query parameters each route takes
// are exactly those openapi.yaml declares for its operation, and the routes
// are the spec's operations, so neither can drift from the other.
func TestRoutesTakeTheSpecsParameters(t *testing.T) {
	t.Parallel()
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	unnamed := regexp.MustCompile(`\{[^}]*\}`)
	routes := map[string][]string{}
	for op, query := range httpapi.RouteQueries() {
		routes[unnamed.ReplaceAllString(op, "{}")] = query
	}
	for path, item := range c.doc.Paths.Map() {
		for method, op := range item.Operations() {
			var spec []string
			for _, p := range append(item.Parameters, op.Parameters...) {
				if p.Value != nil && p.Value.In == openapi3.ParameterInQuery {
					spec = append(spec, p.Value.Name)
				}
			}
			name := method + " " + unnamed.ReplaceAllString(path, "{}")
			query, routed := routes[name]
			if !routed {
				t.Errorf("openapi.yaml's %s %s has no route", method, path)
				continue
			}
			delete(routes, name)
			slices.Sort(spec)
			query = slices.Sorted(slices.Values(query))
			if !slices.Equal(query, spec) {
				t.Errorf("%s %s takes the query parameters %v; openapi.yaml declares %v", method, path, query, spec)
			}
		}
	}
	for op := range routes {
		t.Errorf("the route %s is not in openapi.yaml", op)
	}
}
