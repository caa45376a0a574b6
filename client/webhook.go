package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The headers of a webhook delivery: the signature that VerifyWebhook checks,
// and the event's id, the same on every attempt. The signature does not cover
// WebhookEventIDHeader: read it for logs and routing, and deduplicate on the
// id of the event ParseWebhook returns, which it does cover.
const (
	WebhookSignatureHeader = "Payments-Signature"
	WebhookEventIDHeader   = "Payments-Event-Id"
)

// DefaultWebhookTolerance is how far a webhook's timestamp may be from the
// receiver's clock when VerifyWebhook is given no tolerance.
const DefaultWebhookTolerance = 5 * time.Minute

// Errors of VerifyWebhook; each is wrapped with what was wrong.
var (
	// ErrWebhookHeader: the signature header is not "t=<unix seconds>,v1=<hex>[,v1=<hex>...]".
	ErrWebhookHeader = errors.New("payments: malformed webhook signature header")
	// ErrWebhookSignature: no v1 signature is the HMAC of the body under the secret.
	ErrWebhookSignature = errors.New("payments: webhook signature does not match")
	// ErrWebhookTimestamp: the signature is right, but its timestamp is
	// further from now than the tolerance (a replay, or a clock far off).
	ErrWebhookTimestamp = errors.New("payments: webhook timestamp outside the tolerance")
	// ErrWebhookPayload: the signature is right, but the body is not an
	// event (ParseWebhook only).
	ErrWebhookPayload = errors.New("payments: webhook body is not an event")
)

// ParseWebhook verifies a delivery as VerifyWebhook does and decodes its body
// into the Event it carries. The Event's ID, covered by the signature, is the
// same on every delivery of the event: deduplicate on it. Never deduplicate on
// the WebhookEventIDHeader, which the signature does not cover: a captured
// delivery replayed within the tolerance with another value there verifies,
// and would be handled twice.
//
// It returns the event, or an error wrapping ErrWebhookHeader,
// ErrWebhookSignature or ErrWebhookTimestamp (as VerifyWebhook), or
// ErrWebhookPayload when the signed body is not an event with an id and a
// type.
func ParseWebhook(body []byte, header string, secret string, tolerance time.Duration) (Event, error) {
	if err := VerifyWebhook(body, header, secret, tolerance); err != nil {
		return Event{}, err
	}
	var e Event
	if err := json.Unmarshal(body, &e); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrWebhookPayload, err)
	}
	if e.ID == "" || e.Type == "" {
		return Event{}, fmt.Errorf("%w: no id or no type", ErrWebhookPayload)
	}
	return e, nil
}

// SignWebhook returns the WebhookSignatureHeader value the service sends with
// body at t, signed with secret (the endpoint's whole secret string, "whsec_"
// included): "t=<unix seconds>,v1=<lowercase hex HMAC-SHA256 of
// "<t>.<body>">". It is for a receiver's tests: sign a payload of your own
// and feed it to your handler as a delivery would arrive.
func SignWebhook(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(webhookMAC(secret, ts, body))
}

// webhookMAC is the HMAC-SHA256 under secret of "<ts>.<body>".
func webhookMAC(secret, ts string, body []byte) []byte {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// VerifyWebhook checks that body is what the service signed with secret (the
// endpoint's whole secret string, "whsec_" included) and that the
// signature's timestamp is within tolerance of now (DefaultWebhookTolerance
// when tolerance is 0 or less). header is the Payments-Signature header:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">"; any v1 may match,
// and other schemes are ignored. Pass the body exactly as received, before
// any JSON decoding. The signatures are compared in constant time.
//
// It returns nil, or an error wrapping ErrWebhookHeader, ErrWebhookSignature
// or ErrWebhookTimestamp (checked in that order).
func VerifyWebhook(body []byte, header string, secret string, tolerance time.Duration) error {
	ts, sigs, err := parseWebhookHeader(header)
	if err != nil {
		return err
	}
	want := webhookMAC(secret, strconv.FormatInt(ts, 10), body)
	matched := false
	for _, sig := range sigs {
		// Every signature is compared, so the time taken does not say which one matched.
		if hmac.Equal(sig, want) {
			matched = true
		}
	}
	if !matched {
		return ErrWebhookSignature
	}
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	// time.Duration saturates, so a timestamp far out of range is just far.
	if off := time.Since(time.Unix(ts, 0)).Abs(); off > tolerance {
		return fmt.Errorf("%w: t=%d is %s from now, tolerance %s", ErrWebhookTimestamp, ts, off.Truncate(time.Second), tolerance)
	}
	return nil
}

// parseWebhookHeader reads "t=<unix seconds>" (exactly once) and the v1
// signatures (at least one, each 32 bytes in hex) of a signature header,
// ignoring other keys.
func parseWebhookHeader(header string) (int64, [][]byte, error) {
	var (
		ts    int64
		seenT bool
		sigs  [][]byte
	)
	for _, item := range strings.Split(header, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return 0, nil, fmt.Errorf("%w: %q is not key=value", ErrWebhookHeader, item)
		}
		switch key {
		case "t":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || seenT {
				return 0, nil, fmt.Errorf("%w: want one t=<unix seconds>", ErrWebhookHeader)
			}
			ts, seenT = n, true
		case "v1":
			sig, err := hex.DecodeString(value)
			if err != nil || len(sig) != sha256.Size {
				return 0, nil, fmt.Errorf("%w: v1 is not %d bytes in hex", ErrWebhookHeader, sha256.Size)
			}
			sigs = append(sigs, sig)
		}
	}
	if !seenT || len(sigs) == 0 {
		return 0, nil, fmt.Errorf("%w: want t=<unix seconds> and at least one v1=<hex>", ErrWebhookHeader)
	}
	return ts, sigs, nil
}
