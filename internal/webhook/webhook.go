// Package webhook sends a merchant's events to the merchant's own HTTPS
// endpoints, safely: the signature of a delivery (Sign, with the secret
// NewSecret makes); the guard against server-side request forgery (CheckURL
// when an endpoint is created, and the HTTP client of NewClient, which
// checks every address again after DNS resolution as each delivery connects,
// and follows no redirect); and the Deliverer (deliver.go), which fans events
// out to deliveries, claims them under leases, POSTs them and records every
// attempt, its state kept in PostgreSQL beside the outbox behind the Store
// port it declares. Merchants verify deliveries with the Go client's
// VerifyWebhook. docs/webhooks.md has the design.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
)

// The headers of a delivery.
const (
	// SignatureHeader carries Sign's value.
	SignatureHeader = "Payments-Signature"
	// EventIDHeader carries the event's id, the same on every attempt.
	EventIDHeader = "Payments-Event-Id"
	// UserAgent says who sends a delivery (Go's default was
	// Go-http-client/1.1): a receiver's logs and firewall can tell it.
	UserAgent = "payments-webhooks/1 (+https://github.com/exactlyonce/payments/blob/main/docs/webhooks.md)"
)

// secretPrefix starts every secret, so that one pasted in the wrong place is
// recognisable.
const secretPrefix = "whsec_"

// Sign returns the SignatureHeader value of a delivery of body at t:
// "t=<unix seconds>,v1=<lowercase hex HMAC-SHA256 of "<t>.<body>">", keyed
// with the whole secret string ("whsec_" included). A retry is signed
// afresh, with its own t.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// NewSecret returns a new endpoint secret: "whsec_" and 32 random bytes in
// base64url without padding (49 characters). It returns an error only if
// the system's random source fails.
func NewSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("webhook secret: %w", err)
	}
	return secretPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}
