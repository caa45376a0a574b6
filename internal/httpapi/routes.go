package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/exactlyonce/payments/internal/docs"
)

// route is one operation of the API: its method, its path (under /v1 for
// v1Routes), the query parameters it takes and its handler. The parameters
// are openapi.yaml's for the operation (TestRoutesTakeTheSpecsParameters);
// any other is refused before the handler runs (checkQuery).
type route struct {
	method, pattern string
	query           []string
	handle          func(*Server, http.ResponseWriter, *http.Request)
}

// listParams are the parameters every list takes (parseListQuery);
// listCharges also takes account_id.
var listParams = []string{"limit", "starting_after"}

// v1Routes are the operations under /v1, which need an API key.
var v1Routes = []route{
	{http.MethodPost, "/accounts", nil, (*Server).createAccount},
	{http.MethodGet, "/accounts/{id}", nil, (*Server).getAccount},
	{http.MethodPost, "/accounts/{id}/deposits", nil, (*Server).createDeposit},
	{http.MethodGet, "/accounts/{id}/deposits/{depositID}", nil, (*Server).getDeposit},
	{http.MethodPost, "/charges", nil, (*Server).createCharge},
	{http.MethodGet, "/charges", append([]string{"account_id"}, listParams...), (*Server).listCharges},
	{http.MethodGet, "/charges/{id}", nil, (*Server).getCharge},
	{http.MethodPost, "/charges/{id}/capture", nil, (*Server).captureCharge},
	{http.MethodPost, "/charges/{id}/void", nil, (*Server).voidCharge},
	{http.MethodPost, "/charges/{id}/refunds", nil, (*Server).createRefund},
	{http.MethodGet, "/charges/{id}/refunds/{refundID}", nil, (*Server).getRefund},
	{http.MethodGet, "/events", listParams, (*Server).listEvents},
	{http.MethodGet, "/events/{id}", nil, (*Server).getEvent},
	{http.MethodPost, "/webhook_endpoints", nil, (*Server).createWebhookEndpoint},
	{http.MethodGet, "/webhook_endpoints", nil, (*Server).listWebhookEndpoints},
	{http.MethodGet, "/webhook_endpoints/{id}", nil, (*Server).getWebhookEndpoint},
	{http.MethodPost, "/webhook_endpoints/{id}", nil, (*Server).updateWebhookEndpoint},
	{http.MethodDelete, "/webhook_endpoints/{id}", nil, (*Server).deleteWebhookEndpoint},
	{http.MethodGet, "/webhook_endpoints/{id}/attempts", listParams, (*Server).listWebhookAttempts},
	{http.MethodPost, "/webhook_endpoints/{id}/events/{eventID}/resend", nil, (*Server).resendWebhookEvent},
}

// openRoutes are the operations for operators and browsers, which need no key.
var openRoutes = []route{
	{http.MethodGet, "/healthz", nil, (*Server).healthz},
	{http.MethodGet, "/readyz", nil, (*Server).readyz},
	{http.MethodGet, "/openapi.yaml", nil, (*Server).spec},
	{http.MethodGet, "/problems/{slug}", nil, (*Server).problemDoc},
}

// processorRoutes receive the card processors' webhooks, the simulator's
// and Stripe's, under /v1 but without an API key: their signature says who
// sent them (cards.go).
var processorRoutes = []route{
	{http.MethodPost, "/processor/events", nil, (*Server).processorEvent},
	{http.MethodPost, "/processor/stripe/events", nil, (*Server).stripeEvent},
}

// docsRoute is the documentation page, mounted with its assets under /docs
// when Options.Docs is set; none of them takes a query parameter.
var docsRoute = route{method: http.MethodGet, pattern: "/docs"}

// routes adds the API's operations to r.
func (s *Server) routes(r chi.Router) {
	for _, rt := range openRoutes {
		r.Method(rt.method, rt.pattern, s.handler(rt))
	}
	if s.opts.Docs {
		r.Mount(docsRoute.pattern, s.onlyQuery(docsRoute, docs.Handler("/openapi.yaml", s.fail)))
	}
	r.Route("/v1", func(r chi.Router) {
		// The processor's webhooks carry no API key but its signature.
		for _, rt := range processorRoutes {
			r.Method(rt.method, rt.pattern, s.handler(rt))
		}
		r.Group(func(r chi.Router) {
			r.Use(s.authenticate)
			for _, rt := range v1Routes {
				r.Method(rt.method, rt.pattern, s.handler(rt))
			}
		})
	})
}

// handler is rt's handler behind its query check.
func (s *Server) handler(rt route) http.Handler {
	return s.onlyQuery(rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rt.handle(s, w, r) }))
}

// onlyQuery refuses, before next runs and so before any key is claimed, a
// request whose query string checkQuery refuses.
func (s *Server) onlyQuery(rt route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkQuery(r.URL.RawQuery, rt.query); err != nil {
			s.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// checkQuery refuses a query string that does not parse, that names a
// parameter not in allowed (names are case-sensitive), or that names one
// more than once (which would count is a guess), so that a typo or a feature
// the API lacks is an error rather than a silently ignored parameter. The
// bodyError names the parameter; when several are at fault, the first in
// byte order.
func checkQuery(raw string, allowed []string) error {
	if raw == "" {
		return nil
	}
	values, err := url.ParseQuery(raw)
	if err != nil {
		return &bodyError{detail: "the query string is malformed: " + err.Error()}
	}
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !slices.Contains(allowed, name) {
			takes := "takes no query parameters"
			if len(allowed) > 0 {
				takes = "takes only " + strings.Join(allowed, ", ")
			}
			return &bodyError{field: name, detail: fmt.Sprintf("unknown query parameter %q: this operation %s", name, takes)}
		}
		if n := len(values[name]); n > 1 {
			return &bodyError{field: name, detail: fmt.Sprintf("query parameter %q is given %d times; give it once", name, n)}
		}
	}
	return nil
}
