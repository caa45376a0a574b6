// Package httpapi is the HTTP face of the service: it turns requests into domain
// calls and their results into JSON and RFC 9457 problems. It is the only
// package that knows status codes.
package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/retry"
)

// MaxBodyBytes is the largest request body accepted.
const MaxBodyBytes = 64 << 10

// Backend is what the API needs from storage and the charge path;
// cmd/payments passes the store with the charge path (charging.Path) in front
// of it.
type Backend interface {
	payment.Reader
	// Authenticate returns the merchant owning apiKey, or payment.ErrUnauthenticated;
	// client is the caller's address (see clientOf), for a failure budget.
	Authenticate(ctx context.Context, apiKey, client string) (uuid.UUID, error)
	// Idempotent runs step at most once per (merchant, key); see
	// idempotency.Keys.Idempotent.
	Idempotent(ctx context.Context, req idempotency.Request, step idempotency.Step[payment.Ledger]) (idempotency.Result, error)
	// CreateCharge executes a charge at most once per (merchant, key), group
	// committed with concurrent charges; see charging.Path.CreateCharge.
	CreateCharge(ctx context.Context, req chargedb.KeyedCharge) (idempotency.Result, error)
	// WebhookEndpoints, WebhookEndpoint and DeleteWebhookEndpoint list, read
	// and delete a merchant's live webhook endpoints, never showing their
	// secrets; another merchant's endpoint is payment.ErrNotFound. See
	// postgres.Webhooks.
	WebhookEndpoints(ctx context.Context, merchantID uuid.UUID) ([]payment.WebhookEndpoint, error)
	WebhookEndpoint(ctx context.Context, merchantID, id uuid.UUID) (payment.WebhookEndpoint, error)
	DeleteWebhookEndpoint(ctx context.Context, merchantID, id uuid.UUID) error
	// WebhookAttempts pages the record of a live endpoint's delivery
	// attempts, newest first; see postgres.Webhooks.WebhookAttempts.
	WebhookAttempts(ctx context.Context, merchantID, endpointID uuid.UUID, q payment.AttemptQuery) (payment.Page[payment.RecordedAttempt], error)
	// Ready reports whether this process can serve: the database answers as
	// a primary and the charge path makes progress; payment.ErrUnavailable
	// says why not.
	Ready(ctx context.Context) error
}

// Options configure the API.
type Options struct {
	// Spec is the OpenAPI document served at /openapi.yaml.
	Spec []byte
	// Docs serves the browsable documentation (internal/docs) under /docs,
	// reading the spec from /openapi.yaml.
	Docs bool
	// Front coalesces concurrent requests per key and caches completed
	// responses; nil gives one with no cache.
	Front *idempotency.Front
	// Metrics records requests and outcomes; nil gives a fresh set. The API
	// does not serve them: cmd/payments does, on METRICS_ADDR.
	Metrics *metrics.Metrics
	// TrustedProxies are the proxies whose X-Forwarded-For names the client
	// (clientOf); none by default, and then the header is ignored.
	TrustedProxies []netip.Prefix
	// Cards charges cards at the processor (POST /v1/charges with a
	// payment_method) and receives its webhooks; nil refuses them with
	// 400 no-card-processor.
	Cards CardBackend
	// AllowPrivateNetworks lets webhook endpoints have http URLs and local
	// addresses (WEBHOOK_ALLOW_PRIVATE_NETWORKS): for development and tests
	// only, as it opens the service to server-side request forgery.
	AllowPrivateNetworks bool
	// Budget limits each merchant's requests to this replica
	// (RATE_LIMIT_READS, RATE_LIMIT_WRITES); the zero value none.
	Budget MerchantBudget
	// AccessLog says which requests get an access line (ACCESS_LOG,
	// ACCESS_LOG_SAMPLE); the zero value: every one, at INFO.
	AccessLog AccessLog
}

// AccessLog quietens the access lines: their own Level (the logger's level
// still applies: DEBUG lines leave an INFO log), none at all (Off), or a
// Sample of the successful requests (0 < Sample < 1; 0 means all). A failed
// request (4xx, 5xx) always has its line. The metrics count every request.
type AccessLog struct {
	Level  slog.Level
	Sample float64
	Off    bool
}

// Server routes and answers HTTP requests.
type Server struct {
	backend   Backend
	log       *slog.Logger
	opts      Options
	router    chi.Router
	readiness *retry.Outage // what /readyz last found (ready.go)
	limits    *merchantLimits
}

// New returns the API's HTTP handler.
func New(backend Backend, log *slog.Logger, opts Options) *Server {
	if opts.Front == nil {
		opts.Front = idempotency.NewFront(0, 0, 0, 0)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New()
	}
	s := &Server{backend: backend, log: log, opts: opts, readiness: retry.NewOutage(log, readinessMsg),
		limits: newMerchantLimits(opts.Budget)}
	r := chi.NewRouter()
	r.Use(s.requestID, s.accessLog, s.recoverer, s.canonicalPost)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, refused{"no route for " + methodName(r.Method) + " " + r.URL.Path, payment.ErrNotFound})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		// chi's own 405 handler sets Allow; a custom one must (RFC 9110 15.5.6).
		var allowed []string
		for _, m := range knownMethods {
			if s.router.Match(chi.NewRouteContext(), m, r.URL.Path) {
				allowed = append(allowed, m)
			}
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		s.fail(w, r, refused{methodName(r.Method) + " is not allowed on " + r.URL.Path, errMethodNotAllowed})
	})

	s.routes(r)
	s.router = r
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.router.ServeHTTP(w, r) }

type ctxKey int

const (
	requestIDKey ctxKey = iota
	merchantKey
	accessKey
)

// access is what the handlers tell the access line about their request:
// its merchant, once authenticated, and its idempotency key's hash (as the
// audit lines print it, never the key), once read. accessLog puts one in
// every request's context; only the request's goroutine writes it.
type access struct {
	merchant uuid.UUID
	keyHash  string
}

func accessFrom(ctx context.Context) *access {
	a, _ := ctx.Value(accessKey).(*access)
	if a == nil {
		return &access{} // a handler reached without accessLog (tests)
	}
	return a
}

// RequestIDHeader carries the request id on every response.
const RequestIDHeader = "X-Request-Id"

// requestID adopts a well-formed inbound request id or makes one, and returns it
// on the response.
func (s *Server) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if len(id) > 128 || !idempotency.ValidKey(id) {
			var b [12]byte
			_, _ = rand.Read(b[:])
			id = "req_" + hex.EncodeToString(b[:])
		}
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, id)))
	})
}

func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

func merchantFrom(ctx context.Context) uuid.UUID {
	id, _ := ctx.Value(merchantKey).(uuid.UUID)
	return id
}

// knownMethods are the methods named in metrics and logs; any other is OTHER.
var knownMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions}

// methodName is the request method as metrics and logs show it: one of
// knownMethods or OTHER, so a client cannot add series or log volume by
// inventing methods.
func methodName(m string) string {
	for _, k := range knownMethods {
		if m == k {
			return k
		}
	}
	return "OTHER"
}

// accessLog writes one structured line per request, at INFO, and at DEBUG for
// the health probes (/healthz, /readyz): a load balancer or an orchestrator
// asks every few seconds, and a line each time would bury the requests. It
// never logs headers or bodies, which carry API keys and idempotency keys.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		info := &access{}
		next.ServeHTTP(ww, r.WithContext(context.WithValue(r.Context(), accessKey, info)))
		route := chi.RouteContext(r.Context()).RoutePattern()
		method := methodName(r.Method)
		s.opts.Metrics.Request(route, method, ww.Status(), time.Since(start))
		o := s.opts.AccessLog
		var level slog.Level
		switch {
		case o.Off:
			return
		case route == "/healthz" || route == "/readyz":
			level = slog.LevelDebug
		case ww.Status() < http.StatusBadRequest && o.Sample > 0 && o.Sample < 1 &&
			mrand.Float64() >= o.Sample: //nolint:gosec // G404: sampling log lines guards no secret
			return
		default:
			level = o.Level
		}
		attrs := []slog.Attr{
			slog.String("request_id", requestIDFrom(r.Context())),
			slog.String("method", method),
			slog.String("route", route),
			slog.Int("status", ww.Status()),
			slog.Int("bytes", ww.BytesWritten()),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		}
		if info.merchant != uuid.Nil {
			attrs = append(attrs, slog.String("merchant_id", info.merchant.String()))
		}
		if info.keyHash != "" {
			attrs = append(attrs, slog.String("key_hash", info.keyHash))
		}
		s.log.LogAttrs(r.Context(), level, "request", attrs...)
	})
}

// recoverer answers a panic with a generic 500; any open transaction has
// already been rolled back by then.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "panic", "request_id", requestIDFrom(r.Context()), "panic", v)
				s.writeProblem(w, newProblem(probInternal, "internal error; request id "+requestIDFrom(r.Context())))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// authenticate resolves the bearer API key to its merchant, and refuses a
// request over the merchant's budget (ratelimit.go) before any handler
// reads it, so that a refused request changes nothing.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const prefix = "Bearer "
		if len(r.Header.Values("Authorization")) > 1 {
			// Which one would count is a guess; a proxy may have added one.
			s.fail(w, r, fmt.Errorf("%w: send exactly one Authorization header", payment.ErrUnauthenticated))
			return
		}
		auth := r.Header.Get("Authorization")
		if len(auth) <= len(prefix) || !equalFold(auth[:len(prefix)], prefix) {
			s.fail(w, r, fmt.Errorf("%w: send the API key as Authorization: Bearer <api key>", payment.ErrUnauthenticated))
			return
		}
		merchantID, err := s.backend.Authenticate(r.Context(), auth[len(prefix):], s.clientOf(r))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		accessFrom(r.Context()).merchant = merchantID
		if err := s.limits.take(r.Context(), merchantID, r.Method); err != nil {
			if errors.Is(err, payment.ErrRateLimited) {
				s.opts.Metrics.RateLimited(budgetKind(r.Method))
			}
			s.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), merchantKey, merchantID)))
	})
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i]|0x20, b[i]|0x20
		if x != y {
			return false
		}
	}
	return true
}

// fail answers err: a known domain error with its problem, anything else with a
// generic 500 whose cause goes only to the log.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	p, ok := problemFor(err)
	switch {
	case r.Context().Err() != nil && (!ok || p.status >= 500):
		// Its client has gone: nobody reads the answer, and the service did
		// not fail. (A charge's outcome, once known, is logged apart.)
		s.log.InfoContext(r.Context(), "client left before its answer", "request_id", requestIDFrom(r.Context()), "error", err)
	case p == probUnavailable && s.readiness.Down():
		// The outage /readyz has reported (ready.go): each refusal it causes
		// is no news, but keeps its cause and request id.
		s.log.InfoContext(r.Context(), "request failed", "request_id", requestIDFrom(r.Context()), "error", err)
	case !ok || p.status >= 500:
		s.log.ErrorContext(r.Context(), "request failed", "request_id", requestIDFrom(r.Context()), "error", err)
	}
	s.answerFailure(w, r, err)
}

// answerFailure writes err's problem (see fail) and logs nothing.
func (s *Server) answerFailure(w http.ResponseWriter, r *http.Request, err error) {
	p, ok := problemFor(err)
	if !ok {
		s.writeProblem(w, newProblem(probInternal, "internal error; request id "+requestIDFrom(r.Context())))
		return
	}
	pr := problemFromError(p, err)
	if p.status >= 500 {
		pr.Detail = p.about // the cause is for the log only
	}
	if p == probUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
	}
	var later *payment.RetryAfter
	switch {
	case errors.As(err, &later):
		// Whole seconds, rounded up: a client retrying on time finds the
		// wait over.
		w.Header().Set("Retry-After", strconv.FormatInt(int64(max(1, (later.After+time.Second-1)/time.Second)), 10))
	case p == probKeyInUse || p == probUnavailable:
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	}
	s.writeProblem(w, pr)
}

func (s *Server) writeProblem(w http.ResponseWriter, p problem) {
	writeResponse(w, p.response(), false)
}

// writeResponse writes a response exactly as stored, so a replay is byte for
// byte the original.
func writeResponse(w http.ResponseWriter, resp response, replayed bool) {
	h := w.Header()
	if resp.Status >= 400 {
		h.Set("Content-Type", "application/problem+json")
	} else {
		h.Set("Content-Type", "application/json")
	}
	if resp.Location != "" {
		h.Set("Location", resp.Location)
	}
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// retryAfterSeconds is the Retry-After hint on 409 in-use and 503 answers.
const retryAfterSeconds = 1
