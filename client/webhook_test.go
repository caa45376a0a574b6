package client_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/client"
)

// v1 is the signature the service sends, computed here independently of
// internal/webhook (whose Sign the server's tests check against VerifyWebhook).
func v1(secret string, ts int64, body string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "%d.%s", ts, body)
	return hex.EncodeToString(mac.Sum(nil))
}

// A vector computed by openssl, so that neither side's code defines the scheme:
//
//	printf '%s' '1700000000.{"id":"evt_1","type":"charge.succeeded"}' |
//		openssl dgst -sha256 -hmac whsec_test_secret
func TestVerifyWebhookKnownVector(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1","type":"charge.succeeded"}`)
	header := "t=1700000000,v1=c0475716eb2200f1fe97fcf35a3c05d1fd4f8ba9a07a596730c8d18bb87c0672"
	sinceThen := time.Since(time.Unix(1_700_000_000, 0))
	if err := client.VerifyWebhook(body, header, "whsec_test_secret", sinceThen+time.Hour); err != nil {
		t.Errorf("the openssl vector within its tolerance: %v", err)
	}
	if err := client.VerifyWebhook(body, header, "whsec_test_secret", 0); !errors.Is(err, client.ErrWebhookTimestamp) {
		t.Errorf("the openssl vector, years old, with the default tolerance: %v, want ErrWebhookTimestamp", err)
	}
}

func TestVerifyWebhook(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw2J1YuZbJvbw"
	body := `{"id":"evt_0190c0d5a1b27c3e8f4d6a5b4c3d2e1f","type":"charge.succeeded"}`
	now := time.Now().Unix()
	ago := func(d time.Duration) int64 { return now - int64(d/time.Second) }
	sig := func(ts int64) string { return "t=" + strconv.FormatInt(ts, 10) + ",v1=" + v1(secret, ts, body) }
	good := v1(secret, now, body)

	tests := []struct {
		name      string
		body      string
		header    string
		secret    string
		tolerance time.Duration
		want      error // nil, or the sentinel errors.Is must find
	}{
		{name: "fresh", header: sig(now)},
		{name: "uppercase hex", header: fmt.Sprintf("t=%d,v1=%s", now, strings.ToUpper(good))},
		{name: "spaces after commas", header: fmt.Sprintf("t=%d, v1=%s", now, good)},
		{name: "rotated secret: the second v1 matches", header: fmt.Sprintf("t=%d,v1=%s,v1=%s", now, v1("whsec_old", now, body), good)},
		{name: "other schemes are ignored", header: fmt.Sprintf("v0=abc,t=%d,v1=%s,v2=xyz", now, good)},
		{name: "4 minutes old, default tolerance", header: sig(ago(4 * time.Minute))},
		{name: "10 minutes old, tolerance 15 minutes", header: sig(ago(10 * time.Minute)), tolerance: 15 * time.Minute},

		{name: "tampered body", body: body + " ", header: sig(now), want: client.ErrWebhookSignature},
		{name: "wrong secret", header: sig(now), secret: "whsec_other", want: client.ErrWebhookSignature},
		{name: "secret without its whsec_ prefix", header: sig(now), secret: secret[len("whsec_"):], want: client.ErrWebhookSignature},
		{name: "timestamp moved, signature kept", header: fmt.Sprintf("t=%d,v1=%s", now+1, good), want: client.ErrWebhookSignature},
		{name: "a signature of zeros", header: fmt.Sprintf("t=%d,v1=%x", now, make([]byte, 32)), want: client.ErrWebhookSignature},

		{name: "10 minutes old, default tolerance", header: sig(ago(10 * time.Minute)), want: client.ErrWebhookTimestamp},
		{name: "10 minutes ahead, default tolerance", header: sig(ago(-10 * time.Minute)), want: client.ErrWebhookTimestamp},
		{name: "10 minutes old, negative tolerance means the default", header: sig(ago(10 * time.Minute)), tolerance: -time.Hour, want: client.ErrWebhookTimestamp},
		{name: "the largest timestamp", header: sig(1<<63 - 1), want: client.ErrWebhookTimestamp},
		{name: "the smallest timestamp", header: sig(-1 << 63), want: client.ErrWebhookTimestamp},

		{name: "empty", header: "", want: client.ErrWebhookHeader},
		{name: "no signature", header: fmt.Sprintf("t=%d", now), want: client.ErrWebhookHeader},
		{name: "only other schemes", header: fmt.Sprintf("t=%d,v0=%s", now, good), want: client.ErrWebhookHeader},
		{name: "no timestamp", header: "v1=" + good, want: client.ErrWebhookHeader},
		{name: "two timestamps", header: fmt.Sprintf("t=%d,t=%d,v1=%s", now, now, good), want: client.ErrWebhookHeader},
		{name: "timestamp not a number", header: "t=yesterday,v1=" + good, want: client.ErrWebhookHeader},
		{name: "timestamp in milliseconds past int64", header: "t=99999999999999999999,v1=" + good, want: client.ErrWebhookHeader},
		{name: "signature not hex", header: fmt.Sprintf("t=%d,v1=%s", now, "zz"+good[2:]), want: client.ErrWebhookHeader},
		{name: "signature too short", header: fmt.Sprintf("t=%d,v1=%s", now, good[:62]), want: client.ErrWebhookHeader},
		{name: "item without =", header: fmt.Sprintf("t=%d,v1=%s,junk", now, good), want: client.ErrWebhookHeader},
		{name: "semicolons", header: fmt.Sprintf("t=%d;v1=%s", now, good), want: client.ErrWebhookHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, s := tt.body, tt.secret
			if b == "" {
				b = body
			}
			if s == "" {
				s = secret
			}
			err := client.VerifyWebhook([]byte(b), tt.header, s, tt.tolerance)
			if tt.want == nil && err != nil {
				t.Fatalf("VerifyWebhook: %v, want nil", err)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("VerifyWebhook: %v, want %v", err, tt.want)
			}
		})
	}
}

// SignWebhook writes what the openssl vector above says the service sends.
func TestSignWebhookKnownVector(t *testing.T) {
	t.Parallel()
	got := client.SignWebhook("whsec_test_secret", time.Unix(1_700_000_000, 0), []byte(`{"id":"evt_1","type":"charge.succeeded"}`))
	if want := "t=1700000000,v1=c0475716eb2200f1fe97fcf35a3c05d1fd4f8ba9a07a596730c8d18bb87c0672"; got != want {
		t.Errorf("SignWebhook = %q, want %q", got, want)
	}
}

// deliveryBody is an event as the service delivers it.
const deliveryBody = `{"id":"evt_0190c0d5a1b27c3e8f4d6a5b4c3d2e1f","object":"event","type":"charge.succeeded",` +
	`"created_at":"2026-11-30T12:02:00.654321Z","data":{"id":"ch_0097748e0b70e31f14e42883ee36d0e5","object":"charge","amount":500}}`

func TestParseWebhook(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw2J1YuZbJvbw"
	now := time.Now()
	e, err := client.ParseWebhook([]byte(deliveryBody), client.SignWebhook(secret, now, []byte(deliveryBody)), secret, 0)
	if err != nil {
		t.Fatal(err)
	}
	kind, _ := e.Data.Discriminator()
	ch, err := e.Data.AsCharge()
	if e.ID != "evt_0190c0d5a1b27c3e8f4d6a5b4c3d2e1f" || e.Type != client.EventTypeChargeSucceeded || e.Object != "event" ||
		kind != "charge" || err != nil || ch.Amount != 500 {
		t.Errorf("parsed %+v (data %s, %+v, %v)", e, kind, ch, err)
	}

	for _, tc := range []struct {
		name, body, header string
		want               error
	}{
		{"tampered", deliveryBody + " ", client.SignWebhook(secret, now, []byte(deliveryBody)), client.ErrWebhookSignature},
		{"old", deliveryBody, client.SignWebhook(secret, now.Add(-time.Hour), []byte(deliveryBody)), client.ErrWebhookTimestamp},
		{"no header", deliveryBody, "", client.ErrWebhookHeader},
		{"signed, not JSON", "charge.succeeded", client.SignWebhook(secret, now, []byte("charge.succeeded")), client.ErrWebhookPayload},
		{"signed, not an object", "[]", client.SignWebhook(secret, now, []byte("[]")), client.ErrWebhookPayload},
		{"signed, no id", `{"type":"charge.succeeded"}`, client.SignWebhook(secret, now, []byte(`{"type":"charge.succeeded"}`)), client.ErrWebhookPayload},
		{"signed, no type", `{"id":"evt_1"}`, client.SignWebhook(secret, now, []byte(`{"id":"evt_1"}`)), client.ErrWebhookPayload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := client.ParseWebhook([]byte(tc.body), tc.header, secret, 0)
			if !errors.Is(err, tc.want) || e.ID != "" {
				t.Errorf("ParseWebhook = %+v, %v; want a zero Event and %v", e, err, tc.want)
			}
		})
	}
}

// A delivery captured on its way and sent again within the tolerance, with
// another Payments-Event-Id: the signature still verifies (it does not cover
// the header), so a receiver that deduplicates on the header handles it
// twice; one that deduplicates on the event ParseWebhook returns handles it
// once.
func TestReplayWithAnotherEventIDHeader(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw2J1YuZbJvbw"
	header := client.SignWebhook(secret, time.Now(), []byte(deliveryBody))
	deliveries := []string{"evt_0190c0d5a1b27c3e8f4d6a5b4c3d2e1f", "evt_ffffffffffffffffffffffffffffffff"}

	byHeader, byEvent := map[string]bool{}, map[string]bool{}
	handledByHeader, handledByEvent := 0, 0
	for _, eventIDHeader := range deliveries {
		e, err := client.ParseWebhook([]byte(deliveryBody), header, secret, 0)
		if err != nil {
			t.Fatalf("the replay with %s = %s: %v, want it to verify", client.WebhookEventIDHeader, eventIDHeader, err)
		}
		if !byHeader[eventIDHeader] {
			byHeader[eventIDHeader] = true
			handledByHeader++
		}
		if !byEvent[e.ID] {
			byEvent[e.ID] = true
			handledByEvent++
		}
	}
	if handledByHeader != 2 || handledByEvent != 1 {
		t.Errorf("handled %d times deduplicating on the header, %d on the event id; want 2 and 1", handledByHeader, handledByEvent)
	}
}
