package clienttest_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/webhook"
)

// SignWebhook, the client's, writes byte for byte what the service's
// webhook.Sign sends, so a merchant's tests sign as deliveries are signed.
func TestSignWebhookMatchesTheService(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, secret string
		at           time.Time
		body         []byte
	}{
		{"an event", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw2J1YuZbJvbw", time.Unix(1_700_000_000, 0), []byte(`{"id":"evt_1","type":"charge.succeeded"}`)},
		{"an empty body", "whsec_x", time.Unix(1, 0), nil},
		{"non-ASCII and a sub-second time", "whsec_ü", time.Unix(1_800_000_000, 999_999_999), []byte(`{"description":"café ☕"}`)},
		{"before 1970", "whsec_x", time.Unix(-5, 0), []byte("{}")},
		{"now", "whsec_now", time.Now(), bytes.Repeat([]byte("x"), 70_000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := client.SignWebhook(tc.secret, tc.at, tc.body), webhook.Sign(tc.secret, tc.at, tc.body); got != want {
				t.Errorf("client.SignWebhook = %q, webhook.Sign = %q", got, want)
			}
		})
	}
}

// testReceiverDeduplicates runs the receiver program at path and sends it a
// delivery as the service would (signed by webhook.Sign), then the same
// delivery again within the tolerance with another Payments-Event-Id, as one
// who captured it could: the signature verifies both times, and the receiver
// handles the event once. A delivery whose body was changed is refused.
func testReceiverDeduplicates(t *testing.T, path string) {
	t.Helper()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw2J1YuZbJvbw"
	addr := freeAddr(t)
	var logs testkit.LogBuffer
	cmd := exec.Command(path)
	cmd.Env = []string{"WEBHOOK_SECRET=" + secret, "RECEIVER_ADDR=" + addr}
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	event := payment.Event{ID: payment.NewID(), Type: payment.EventChargeSucceeded, CreatedAt: time.Now(),
		Data: json.RawMessage(`{"id":"ch_0097748e0b70e31f14e42883ee36d0e5","object":"charge","amount":500}`)}
	body, err := json.Marshal(event)
	if err != nil {
		t.Fatal(err)
	}
	eventID := payment.FormatID(payment.PrefixEvent, event.ID)
	signature := webhook.Sign(secret, time.Now(), body)
	send := func(body []byte, eventIDHeader string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/hooks/payments", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(webhook.SignatureHeader, signature)
		req.Header.Set(webhook.EventIDHeader, eventIDHeader)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			resp, err := http.DefaultClient.Do(req.Clone(req.Context()))
			if err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			if time.Now().After(deadline) {
				t.Fatalf("the receiver did not answer in 10 s: %v\n%s", err, logs.String())
			}
			req.Body, _ = req.GetBody()
		}
	}
	replayID := payment.FormatID(payment.PrefixEvent, uuid.New())
	if got := send(body, eventID); got != http.StatusNoContent {
		t.Fatalf("the delivery: %d, want 204\n%s", got, logs.String())
	}
	if got := send(body, replayID); got != http.StatusNoContent {
		t.Fatalf("the replay with another %s: %d, want 204 (a duplicate is acknowledged)\n%s", webhook.EventIDHeader, got, logs.String())
	}
	if got := send(bytes.Replace(body, []byte("500"), []byte("900"), 1), eventID); got != http.StatusBadRequest {
		t.Errorf("a delivery with a changed body: %d, want 400", got)
	}
	out := logs.String()
	if n := strings.Count(out, "verified charge.succeeded "+eventID); n != 1 {
		t.Errorf("the receiver handled the event %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "duplicate charge.succeeded "+eventID) || strings.Contains(out, replayID) {
		t.Errorf("the replay was not logged as a duplicate of %s:\n%s", eventID, out)
	}
}

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
