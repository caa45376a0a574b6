package procsim_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/procsim"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

func TestMain(m *testing.M) { procsimtest.Main(m) }

// sim is a simulator process and the test that started it.
type sim struct {
	*procsimtest.Sim
	t *testing.T
}

// startSim starts a simulator with flags on a fresh database of its own.
func startSim(t *testing.T, flags ...string) *sim {
	t.Helper()
	return &sim{Sim: procsimtest.Start(t, flags...), t: t}
}

func (s *sim) url(path string) string { return s.URL() + path }

// reply is one answer, read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// client opens a connection per request, so a dropped answer is seen as one
// (Go's transport resends a keyed request on a reused connection by itself).
func client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
}

func (s *sim) do(c *http.Client, method, path, key string, body any) (reply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.url(path), rd)
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// must is do for a request that has to be answered.
func (s *sim) must(method, path, key string, body any) reply {
	s.t.Helper()
	r, err := s.do(client(10*time.Second), method, path, key, body)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (s *sim) authorize(key string, req procsim.AuthorizeRequest) reply {
	s.t.Helper()
	return s.must(http.MethodPost, "/v1/authorizations", key, req)
}

// audit returns what the simulator did under ref (zero counts if nothing).
func (s *sim) audit(ref string) procsim.AuditReference {
	s.t.Helper()
	r := s.must(http.MethodGet, "/v1/audit?reference="+url.QueryEscape(ref), "", nil)
	var a procsim.Audit
	if err := json.Unmarshal(r.body, &a); err != nil {
		s.t.Fatalf("audit: %v: %s", err, r.body)
	}
	if len(a.References) == 0 {
		return procsim.AuditReference{Reference: ref}
	}
	return a.References[0]
}

// eventually polls cond every 50 ms for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func decode[T any](t *testing.T, r reply) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %d %s: %v", r.status, r.body, err)
	}
	return v
}

func auth(ref, method string, amount int64) procsim.AuthorizeRequest {
	return procsim.AuthorizeRequest{Amount: amount, Currency: "EUR", PaymentMethod: method, Reference: ref}
}
