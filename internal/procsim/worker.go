package procsim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Event is the body of a webhook: what happened to a payment, as it is now.
type Event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	Payment   Payment   `json:"payment"`
}

// EventAuthorized announces an asynchronous approval.
const EventAuthorized = "payment.authorized"

// SignatureHeader carries a webhook's signature: "t=<unix seconds>,v1=<hex
// HMAC-SHA256 of "<t>.<body>" under the webhook secret>".
const SignatureHeader = "Procsim-Signature"

// Sign returns the SignatureHeader value for body sent at t.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret, ts string, body []byte) string {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts + "."))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// ErrBadSignature is a webhook whose signature does not verify, or is older
// than the tolerance.
var ErrBadSignature = errors.New("procsim: bad webhook signature")

// VerifySignature checks header (SignatureHeader) against body and secret,
// and that it was signed within tolerance of now. It returns ErrBadSignature
// if not.
func VerifySignature(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	var ts, sig string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || !hmac.Equal([]byte(sig), []byte(mac(secret, ts, body))) {
		return ErrBadSignature
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrBadSignature
	}
	return nil
}

// Run does the simulator's background work until ctx ends: it decides
// pending authorizations, cancels those never answered within the decision
// deadline, and delivers webhooks. Each step survives a restart: it reads
// only the database.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.tick())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, step := range []func(context.Context) error{s.decidePending, s.expireUnanswered, s.deliverEvents} {
			if err := step(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("background step failed", "err", err)
			}
		}
	}
}

// decidePending approves the pending authorizations whose time has come and
// queues a webhook for each, in one transaction.
func (s *Server) decidePending(ctx context.Context) error {
	return s.store.inTx(ctx, func(tx pgx.Tx) error {
		now := dbNow()
		rows, err := tx.Query(ctx, `SELECT `+paymentColumns+` FROM procsim_payments
			WHERE status = 'pending' AND decide_at <= $1 LIMIT 100 FOR UPDATE SKIP LOCKED`, now)
		if err != nil {
			return err
		}
		ps, err := collectPayments(rows)
		if err != nil {
			return err
		}
		for _, p := range ps {
			approve(&p)
			if err := savePayment(ctx, tx, p, now); err != nil {
				return err
			}
			if err := recordOutcome(ctx, tx, p, now); err != nil {
				return err
			}
			if s.cfg.WebhookURL == "" {
				continue
			}
			ev := Event{ID: "evt_" + strings.TrimPrefix(newPSPReference(), "psp_"), Type: EventAuthorized, CreatedAt: now, Payment: p}
			payload, _ := json.Marshal(ev)
			if _, err := tx.Exec(ctx, `INSERT INTO procsim_events (id, payload, created_at, next_attempt_at)
				VALUES ($1, $2, $3, $3)`, ev.ID, payload, now); err != nil {
				return fmt.Errorf("insert event: %w", err)
			}
		}
		return nil
	})
}

// expireUnanswered cancels every approval whose answer was never delivered
// (dropped, answered too late, 500 after processing) once the decision
// deadline has passed, as Adyen cancels an authorization it could not answer.
func (s *Server) expireUnanswered(ctx context.Context) error {
	return s.store.inTx(ctx, func(tx pgx.Tx) error {
		now := dbNow()
		rows, err := tx.Query(ctx, `SELECT `+paymentColumns+` FROM procsim_payments
			WHERE answered_at IS NULL AND status IN ('authorized', 'captured') AND created_at <= $1
			LIMIT 100 FOR UPDATE SKIP LOCKED`, now.Add(-s.cfg.DecisionDeadline))
		if err != nil {
			return err
		}
		ps, err := collectPayments(rows)
		if err != nil {
			return err
		}
		for _, p := range ps {
			amount, _ := cancelAll(&p, StatusExpired)
			if err := savePayment(ctx, tx, p, now); err != nil {
				return err
			}
			if err := recordAction(ctx, tx, p.PSPReference, actionExpire, amount, now); err != nil {
				return err
			}
		}
		return nil
	})
}

// deliverEvents POSTs the due webhooks, each at least once, retrying a failed
// one with a doubling delay up to a minute.
func (s *Server) deliverEvents(ctx context.Context) error {
	if s.cfg.WebhookURL == "" {
		return nil
	}
	type due struct {
		id       string
		payload  []byte
		attempts int
	}
	rows, err := s.store.pool.Query(ctx, `SELECT id, payload, attempts FROM procsim_events
		WHERE delivered_at IS NULL AND next_attempt_at <= $1 ORDER BY next_attempt_at LIMIT 20`, time.Now())
	if err != nil {
		return err
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		return d, r.Scan(&d.id, &d.payload, &d.attempts)
	})
	if err != nil {
		return err
	}
	for _, ev := range events {
		err := s.post(ctx, ev.payload)
		now := time.Now()
		if err == nil {
			_, err = s.store.pool.Exec(ctx, `UPDATE procsim_events SET delivered_at = $2, attempts = attempts + 1 WHERE id = $1`, ev.id, now)
			if err != nil {
				return err
			}
			continue
		}
		s.log.Warn("webhook delivery failed", "event", ev.id, "attempt", ev.attempts+1, "err", err)
		wait := min(time.Duration(1<<min(ev.attempts, 10))*100*time.Millisecond, time.Minute)
		if _, err := s.store.pool.Exec(ctx, `UPDATE procsim_events SET attempts = attempts + 1, next_attempt_at = $2
			WHERE id = $1`, ev.id, now.Add(wait)); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) post(ctx context.Context, payload []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.WebhookURL, bytes.NewReader(payload))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign(s.cfg.WebhookSecret, time.Now(), payload))
	resp, err := s.webhooks.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered %d", resp.StatusCode)
	}
	return nil
}
