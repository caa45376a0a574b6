package processor

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

// Event is an asynchronous outcome the processor announces (a webhook): its
// id, unique at the processor, its type and the payment as it now stands.
type Event struct {
	ID      string  `json:"id"`
	Type    string  `json:"type"`
	Payment Payment `json:"payment"`
}

// SimulatorSignatureHeader carries a simulator webhook's signature:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the secret>".
const SimulatorSignatureHeader = "Procsim-Signature"

// ErrBadEvent is a webhook that is not the processor's: its signature does
// not verify under the secret or was made further than the tolerance from
// now, or it is no event.
var ErrBadEvent = errors.New("processor: not a verified processor event")

// ParseSimulatorEvent verifies a simulator webhook's signature (the value
// of SimulatorSignatureHeader) over body with secret, made within tolerance
// of now, and decodes it. Its errors are ErrBadEvent.
func ParseSimulatorEvent(secret, signature string, body []byte, tolerance time.Duration, now time.Time) (Event, error) {
	var ts, sig string
	for part := range strings.SplitSeq(signature, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts + "."))
	h.Write(body)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if secret == "" || err != nil || !hmac.Equal([]byte(sig), []byte(hex.EncodeToString(h.Sum(nil)))) {
		return Event{}, fmt.Errorf("%w: bad signature", ErrBadEvent)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return Event{}, fmt.Errorf("%w: bad signature", ErrBadEvent)
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	if ev.ID == "" {
		return Event{}, fmt.Errorf("%w: it has no id", ErrBadEvent)
	}
	return ev, nil
}

// Webhooks verifies and decodes a processor's webhooks: each adapter's own
// signature scheme.
type Webhooks interface {
	// SignatureHeader names the request header that carries a webhook's
	// signature.
	SignatureHeader() string
	// ParseEvent verifies signature over body, made within tolerance of
	// now, and decodes the event. Its errors are ErrBadEvent. An event that
	// is about no payment has an empty Payment.
	ParseEvent(signature string, body []byte, tolerance time.Duration, now time.Time) (Event, error)
}

// SimulatorWebhooks verifies the simulator's webhooks with Secret.
type SimulatorWebhooks struct{ Secret string }

// SignatureHeader is SimulatorSignatureHeader.
func (SimulatorWebhooks) SignatureHeader() string { return SimulatorSignatureHeader }

// ParseEvent is ParseSimulatorEvent with w's secret.
func (w SimulatorWebhooks) ParseEvent(signature string, body []byte, tolerance time.Duration, now time.Time) (Event, error) {
	return ParseSimulatorEvent(w.Secret, signature, body, tolerance, now)
}
