package webhook_test

import (
	"encoding/base64"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/webhook"
)

// The scheme pinned by a vector that openssl computed (the client's test
// checks VerifyWebhook against the same one):
//
//	printf '%s' '1700000000.{"id":"evt_1","type":"charge.succeeded"}' |
//		openssl dgst -sha256 -hmac whsec_test_secret
func TestSignKnownVector(t *testing.T) {
	t.Parallel()
	got := webhook.Sign("whsec_test_secret", time.Unix(1_700_000_000, 999_999_999), []byte(`{"id":"evt_1","type":"charge.succeeded"}`))
	want := "t=1700000000,v1=c0475716eb2200f1fe97fcf35a3c05d1fd4f8ba9a07a596730c8d18bb87c0672"
	if got != want {
		t.Errorf("Sign = %q, want %q", got, want)
	}
}

// The server's Sign and the client's VerifyWebhook agree, and the client
// refuses every alteration of what was signed.
func TestSignVerifiesWithClient(t *testing.T) {
	t.Parallel()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"evt_0190c0d5a1b27c3e8f4d6a5b4c3d2e1f","object":"event","type":"charge.succeeded"}`)
	now := time.Now()
	if client.WebhookSignatureHeader != webhook.SignatureHeader || client.WebhookEventIDHeader != webhook.EventIDHeader {
		t.Errorf("header names differ: client %q %q, server %q %q", client.WebhookSignatureHeader,
			client.WebhookEventIDHeader, webhook.SignatureHeader, webhook.EventIDHeader)
	}

	tests := []struct {
		name   string
		body   []byte
		header string
		secret string
		want   error
	}{
		{name: "as signed", body: body, header: webhook.Sign(secret, now, body), secret: secret},
		{name: "signed 4 minutes ago", body: body, header: webhook.Sign(secret, now.Add(-4*time.Minute), body), secret: secret},
		{name: "body tampered", body: []byte(strings.Replace(string(body), "succeeded", "failed", 1)),
			header: webhook.Sign(secret, now, body), secret: secret, want: client.ErrWebhookSignature},
		{name: "body truncated", body: body[:len(body)-1], header: webhook.Sign(secret, now, body), secret: secret, want: client.ErrWebhookSignature},
		{name: "wrong secret", body: body, header: webhook.Sign(secret, now, body), secret: mustSecret(t), want: client.ErrWebhookSignature},
		{name: "secret without its prefix", body: body, header: webhook.Sign(secret, now, body),
			secret: strings.TrimPrefix(secret, "whsec_"), want: client.ErrWebhookSignature},
		{name: "signed 10 minutes ago", body: body, header: webhook.Sign(secret, now.Add(-10*time.Minute), body), secret: secret, want: client.ErrWebhookTimestamp},
		{name: "signed 10 minutes ahead", body: body, header: webhook.Sign(secret, now.Add(10*time.Minute), body), secret: secret, want: client.ErrWebhookTimestamp},
		{name: "header without t", body: body, header: strings.SplitN(webhook.Sign(secret, now, body), ",", 2)[1], secret: secret, want: client.ErrWebhookHeader},
		{name: "header without v1", body: body, header: strings.SplitN(webhook.Sign(secret, now, body), ",", 2)[0], secret: secret, want: client.ErrWebhookHeader},
		{name: "empty header", body: body, secret: secret, want: client.ErrWebhookHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := client.VerifyWebhook(tt.body, tt.header, tt.secret, 0)
			if !errors.Is(err, tt.want) { // errors.Is(nil, nil) holds
				t.Fatalf("VerifyWebhook: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestNewSecret(t *testing.T) {
	t.Parallel()
	form := regexp.MustCompile(`^whsec_[A-Za-z0-9_-]{43}$`)
	seen := map[string]bool{}
	for range 100 {
		s := mustSecret(t)
		if !form.MatchString(s) {
			t.Fatalf("NewSecret = %q, want whsec_ and 43 base64url characters", s)
		}
		if raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(s, "whsec_")); err != nil || len(raw) != 32 {
			t.Fatalf("NewSecret = %q: %d bytes (%v), want 32", s, len(raw), err)
		}
		if seen[s] {
			t.Fatalf("NewSecret returned %q twice", s)
		}
		seen[s] = true
	}
}

func mustSecret(t *testing.T) string {
	t.Helper()
	s, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
