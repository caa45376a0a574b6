package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/exactlyonce/payments"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/webhook"
)

// The contract test: every exchange of this package's integration tests goes
// through (*fixture).do, which hands it to checkContract. The response must be
// one that openapi.yaml documents for the operation and status, so the spec
// cannot drift from the code. The request is checked too, but only when the
// service accepted it (2xx): the tests send invalid requests on purpose.

// contract is openapi.yaml, loaded and validated once for the package.
type contract struct {
	doc    *openapi3.T
	router routers.Router
}

var loadContract = sync.OnceValues(func() (*contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(payments.OpenAPI)
	if err != nil {
		return nil, fmt.Errorf("load openapi.yaml: %w", err)
	}
	// Route by path alone: the servers ("/" and localhost:8080) say where the
	// API lives, not which host the test server listens on.
	doc.Servers = nil
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	return &contract{doc: doc, router: router}, nil
})

// genericHeaders are HTTP's own response headers, which the spec need not
// document. Any other header the service sends must be documented for the
// operation and status it comes with.
var genericHeaders = []string{
	"Content-Type", "Content-Length", "Date", "Transfer-Encoding", "Connection",
	"Keep-Alive", "Vary", "Cache-Control", "Etag", "Last-Modified", "Accept-Ranges",
	"X-Content-Type-Options",
}

// checkContract reports as test errors every way the exchange breaks
// openapi.yaml: a status not documented for the operation, a response whose
// headers or body do not match the documented response, an undocumented
// response header, and, when the response is a 2xx, a request that the
// documented operation would refuse. Requests to paths or methods the spec
// does not describe (404, 405) are checked only for a well-formed problem.
// It calls t.Errorf, never t.Fatal, so it may run in any goroutine.
func checkContract(t *testing.T, req *http.Request, resp *http.Response, body []byte) {
	t.Helper()
	c, err := loadContract()
	if err != nil {
		t.Errorf("contract: %v", err)
		return
	}
	if err := c.check(req, resp, body); err != nil {
		t.Errorf("contract: %s %s -> %d breaks openapi.yaml:\n%v\nresponse body: %s",
			req.Method, req.URL.RequestURI(), resp.StatusCode, err, truncate(body))
	}
}

func (c *contract) check(req *http.Request, resp *http.Response, body []byte) error {
	ctx := context.Background()
	route, pathParams, err := c.router.FindRoute(req)
	if err != nil {
		var re *routers.RouteError
		if errors.As(err, &re) && (re.Reason == routers.ErrPathNotFound.Error() || re.Reason == routers.ErrMethodNotAllowed.Error()) {
			return c.checkUnrouted(resp, body)
		}
		return fmt.Errorf("find route: %w", err)
	}

	in := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: pathParams,
		Route:      route,
		Options: &openapi3filter.Options{
			MultiError:         true,
			AuthenticationFunc: bearerOnly,
		},
	}
	var errs []error
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// Validate a copy: ValidateRequest reads the body and may set defaults.
		r, err := replayable(req)
		if err != nil {
			errs = append(errs, err)
		} else {
			in.Request = r
			if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
				errs = append(errs, fmt.Errorf("the service accepted a request the spec refuses: %w", err))
			}
		}
	}

	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options: &openapi3filter.Options{
			MultiError:            true,
			IncludeResponseStatus: true,
		},
	}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		errs = append(errs, fmt.Errorf("response: %w", err))
	}
	if documented := route.Operation.Responses.Status(resp.StatusCode); documented != nil && documented.Value != nil {
		for name := range resp.Header {
			if slices.Contains(genericHeaders, name) {
				continue
			}
			if !hasHeader(documented.Value.Headers, name) {
				errs = append(errs, fmt.Errorf("response header %s is not documented for %s %s %d",
					name, route.Method, route.Path, resp.StatusCode))
			}
		}
	}
	return errors.Join(errs...)
}

// checkDelivery reports as test errors every way a webhook delivery, as a
// receiver got it, breaks what openapi.yaml says under webhooks.event: its
// headers and its body. It calls t.Errorf, never t.Fatal, so it may run in
// a receiver's goroutine.
func checkDelivery(t *testing.T, req *http.Request, body []byte) {
	t.Helper()
	c, err := loadContract()
	if err != nil {
		t.Errorf("contract: %v", err)
		return
	}
	if err := c.checkDelivery(req, body); err != nil {
		t.Errorf("contract: a delivery breaks openapi.yaml's webhooks.event:\n%v\nbody: %s", err, truncate(body))
	}
}

func (c *contract) checkDelivery(req *http.Request, body []byte) error {
	event := c.doc.Webhooks["event"]
	if event == nil || event.Post == nil {
		return errors.New("openapi.yaml has no webhooks.event.post")
	}
	r := req.Clone(context.Background())
	r.Body = io.NopCloser(bytes.NewReader(body))
	return openapi3filter.ValidateRequest(context.Background(), &openapi3filter.RequestValidationInput{
		Request: r,
		Route:   &routers.Route{Spec: c.doc, Path: req.URL.Path, PathItem: event, Method: http.MethodPost, Operation: event.Post},
		Options: &openapi3filter.Options{MultiError: true},
	})
}

// TestDeliveryContractCatchesDrift feeds checkDelivery made-up deliveries:
// one as the service sends it keeps webhooks.event; one without its
// signature, with a malformed one, or whose body is not an event does not.
func TestDeliveryContractCatchesDrift(t *testing.T) {
	t.Parallel()
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	const (
		event = `{"id":"evt_610ef9c0501db8086c5ed6031b375beb","object":"event","type":"account.created",` +
			`"created_at":"2026-11-30T12:02:00.654321Z","data":{"id":"acct_4a5f3df99a5d518c03adf918c80d03ef","object":"account",` +
			`"currency":"USD","balance":0,"available":0,"description":null,"metadata":{},"created_at":"2026-11-30T12:02:00.654321Z"}}`
		id = "evt_610ef9c0501db8086c5ed6031b375beb"
	)
	for _, tc := range []struct {
		name, signature, eventID, body, wantErr string
	}{
		{"as sent", webhook.Sign("whsec_x", time.Now(), []byte(event)), id, event, ""},
		{"no signature", "", id, event, "Payments-Signature"},
		{"a signature without v1", "t=1764504120", id, event, "Payments-Signature"},
		{"no event id", webhook.Sign("whsec_x", time.Now(), []byte(event)), "", event, "Payments-Event-Id"},
		{"not an event", webhook.Sign("whsec_x", time.Now(), []byte(`{"id":"x"}`)), id, `{"id":"x"}`, "request body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/hooks", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			for name, v := range map[string]string{webhook.SignatureHeader: tc.signature, webhook.EventIDHeader: tc.eventID} {
				if v != "" {
					req.Header.Set(name, v)
				}
			}
			err = c.checkDelivery(req, []byte(tc.body))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("want no error, got:\n%v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("want an error containing %q, got: %v", tc.wantErr, err)
			}
		})
	}
}

// checkUnrouted checks the answer to a request the spec has no operation
// for: if it is a problem, it must be a well-formed one.
func (c *contract) checkUnrouted(resp *http.Response, body []byte) error {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return nil
	}
	schema := c.doc.Components.Schemas["Problem"]
	if schema == nil || schema.Value == nil {
		return errors.New("components.schemas.Problem is missing")
	}
	var v any
	if err := decodeJSON(body, &v); err != nil {
		return fmt.Errorf("problem body: %w", err)
	}
	if err := schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.MultiErrors()); err != nil {
		return fmt.Errorf("problem body does not match components.schemas.Problem: %w", err)
	}
	return nil
}

// bearerOnly accepts the API's one security scheme when the request carries
// an Authorization: Bearer header; whether the key is valid is the service's
// business (a 2xx says it was).
func bearerOnly(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	s := in.SecurityScheme
	if s == nil || s.Type != "http" || !strings.EqualFold(s.Scheme, "bearer") {
		return in.NewError(fmt.Errorf("unexpected security scheme %q", in.SecuritySchemeName))
	}
	auth := in.RequestValidationInput.Request.Header.Get("Authorization")
	if len(auth) <= len("Bearer ") || !strings.EqualFold(auth[:len("Bearer ")], "Bearer ") {
		return in.NewError(errors.New("no Authorization: Bearer header"))
	}
	return nil
}

// replayable returns a copy of req with a fresh body to read; the original's
// was consumed by sending it.
func replayable(req *http.Request) (*http.Request, error) {
	r := req.Clone(context.Background())
	if req.Body == nil || req.Body == http.NoBody {
		r.Body = http.NoBody
		return r, nil
	}
	if req.GetBody == nil {
		return nil, errors.New("cannot validate the request body: build the request with a strings, bytes or bytes.Buffer reader so it can be read again")
	}
	b, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	data, err := io.ReadAll(b)
	if err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	return r, nil
}

func hasHeader(headers openapi3.Headers, name string) bool {
	for k := range headers {
		if http.CanonicalHeaderKey(k) == name {
			return true
		}
	}
	return false
}

func decodeJSON(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	return dec.Decode(v)
}

func truncate(b []byte) string {
	const max = 2000
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

// TestContractCheckCatchesDrift feeds the contract check made-up exchanges, so
// a check that silently passes everything cannot go unnoticed.
func TestContractCheckCatchesDrift(t *testing.T) {
	t.Parallel()
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	const (
		acct   = "acct_4a5f3df99a5d518c03adf918c80d03ef"
		charge = `{"id":"ch_0097748e0b70e31f14e42883ee36d0e5","object":"charge","account_id":"` + acct + `",` +
			`"amount":500,"currency":"USD","status":"succeeded","failure_code":null,"amount_captured":500,"amount_refunded":0,` +
			`"expires_at":null,"description":null,"metadata":{},"created_at":"2026-11-30T12:02:00.654321Z"}`
		newCharge = `{"account_id":"` + acct + `","amount":500,"currency":"USD"}`
		problem   = `{"type":"/problems/not-found","title":"Not found","status":404,"detail":"no route","code":"not-found"}`
	)
	chargeHeaders := map[string]string{"Location": "/v1/charges/ch_0097748e0b70e31f14e42883ee36d0e5", "X-Request-Id": "req_1"}
	cases := []struct {
		name        string
		method      string
		path        string
		reqBody     string
		status      int
		contentType string
		headers     map[string]string
		body        string
		wantErr     string // "" when the exchange keeps the contract
	}{
		{"a charge", "POST", "/v1/charges", newCharge, 201, "application/json", chargeHeaders, charge, ""},
		{"undocumented status", "POST", "/v1/charges", newCharge, 418, "application/problem+json", nil, problem, "status is not supported"},
		{"body missing members", "POST", "/v1/charges", newCharge, 201, "application/json", chargeHeaders, `{"id":"ch_0097748e0b70e31f14e42883ee36d0e5"}`, "missing properties"},
		{"no Location", "POST", "/v1/charges", newCharge, 201, "application/json", map[string]string{"X-Request-Id": "req_1"}, charge, `"Location" missing`},
		{"undocumented header", "POST", "/v1/charges", newCharge, 201, "application/json",
			map[string]string{"Location": chargeHeaders["Location"], "X-Debug": "1"}, charge, "X-Debug is not documented"},
		{"accepted request the spec refuses", "POST", "/v1/charges", `{"account_id":"` + acct + `","amount":500,"currency":"USD","capture_method":"manual"}`,
			201, "application/json", chargeHeaders, charge, "the service accepted a request the spec refuses"},
		{"401 without WWW-Authenticate", "GET", "/v1/charges", "", 401, "application/problem+json", nil,
			`{"type":"/problems/unauthorized","title":"Unauthorized","status":401,"detail":"x","code":"unauthorized"}`, `"WWW-Authenticate" missing`},
		{"unknown path", "GET", "/nope", "", 404, "application/problem+json", nil, problem, ""},
		{"unknown path, bad problem", "GET", "/nope", "", 404, "application/problem+json", nil, `{"status":"404"}`, "components.schemas.Problem"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader
			if tc.reqBody != "" {
				rd = strings.NewReader(tc.reqBody)
			}
			req, err := http.NewRequest(tc.method, "http://127.0.0.1:1"+tc.path, rd)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer sk_test")
			if tc.method == http.MethodPost {
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "k1")
			}
			resp := &http.Response{StatusCode: tc.status, Header: http.Header{}}
			resp.Header.Set("Content-Type", tc.contentType)
			for k, v := range tc.headers {
				resp.Header.Set(k, v)
			}
			if tc.status == http.StatusUnauthorized && tc.wantErr == "" {
				resp.Header.Set("WWW-Authenticate", `Bearer realm="payments"`)
			}
			err = c.check(req, resp, []byte(tc.body))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("want no error, got:\n%v", err)
			case tc.wantErr != "" && err == nil:
				t.Errorf("want an error containing %q, got none", tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Errorf("want an error containing %q, got:\n%v", tc.wantErr, err)
			}
		})
	}
}

// TestEventTypesMatchTheSpec: the event types a webhook endpoint may
// subscribe to (payment.EventTypes) are the ones openapi.yaml documents for
// events, no more and no fewer.
func TestEventTypesMatchTheSpec(t *testing.T) {
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	event := c.doc.Components.Schemas["Event"]
	if event == nil || event.Value.Properties["type"] == nil {
		t.Fatal("openapi.yaml has no Event schema with a type")
	}
	var documented []string
	for _, v := range event.Value.Properties["type"].Value.Enum {
		documented = append(documented, fmt.Sprint(v))
	}
	got, want := slices.Sorted(slices.Values(payment.EventTypes)), slices.Sorted(slices.Values(documented))
	if !slices.Equal(got, want) {
		t.Errorf("payment.EventTypes %v, openapi.yaml's Event.type %v", got, want)
	}
}
