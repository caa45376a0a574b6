package procsim_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/procsim"
)

// delivery is one webhook as the receiver got it.
type delivery struct {
	signature string
	body      []byte
}

// TestAsyncWebhook: a pending authorization is decided later and announced
// by a webhook signed with the secret, delivered again after a failure.
func TestAsyncWebhook(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got []delivery
	)
	failFirst := true
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, delivery{r.Header.Get(procsim.SignatureHeader), b})
		if failFirst {
			failFirst = false
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer receiver.Close()
	const secret = "whsec_test"
	s := startSim(t, "-webhook-url", receiver.URL, "-webhook-secret", secret)

	r := s.authorize("key-async", auth("ref_async", "pm_card_async_pending", 1500))
	if r.status != http.StatusAccepted {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	pending := decode[procsim.AuthorizeAnswer](t, r)
	eventually(t, 10*time.Second, "two deliveries (a failed one and its retry)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 2
	})
	mu.Lock()
	d := got[1]
	first := got[0]
	mu.Unlock()
	if string(first.body) != string(d.body) {
		t.Fatalf("the retry carries another body:\n%s\n%s", first.body, d.body)
	}
	if err := procsim.VerifySignature(secret, d.signature, d.body, time.Minute, time.Now()); err != nil {
		t.Fatalf("signature %q: %v", d.signature, err)
	}
	if err := procsim.VerifySignature("whsec_other", d.signature, d.body, time.Minute, time.Now()); !errors.Is(err, procsim.ErrBadSignature) {
		t.Fatalf("another secret verified: %v", err)
	}
	var ev procsim.Event
	if err := json.Unmarshal(d.body, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != procsim.EventAuthorized || ev.Payment.PSPReference != pending.PSPReference ||
		ev.Payment.Status != procsim.StatusCaptured || ev.Payment.ApprovedAmount != 1500 {
		t.Fatalf("event: %+v", ev)
	}
	wantAudit(t, s, "ref_async", procsim.AuditCounts{Approvals: 1, ApprovedAmount: 1500, Captures: 1, CapturedAmount: 1500})
}
