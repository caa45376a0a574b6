package payment

import (
	"bytes"
	"encoding/json"
	"time"
)

// The JSON forms below are the public representation of each object: the API
// answers with them and events carry them in their data member. The encoding is
// deterministic (fixed member order, sorted metadata keys), so equal objects
// give equal bytes.

// marshal is json.Marshal without HTML escaping: json.Marshal writes each <, >
// and & as six bytes (\u003c), which nothing here needs, as responses are never
// embedded in HTML. The encoding stays deterministic.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// timestamp renders times as RFC 3339 in UTC with microseconds, the precision
// PostgreSQL keeps, so a stored response and a later read agree.
type timestamp time.Time

func (t timestamp) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(t).UTC().Format("2006-01-02T15:04:05.000000Z07:00") + `"`), nil
}

// MarshalJSON renders the account as the API shows it.
func (a Account) MarshalJSON() ([]byte, error) {
	return marshal(struct {
		ID          string            `json:"id"`
		Object      string            `json:"object"`
		Currency    string            `json:"currency"`
		Balance     int64             `json:"balance"`
		Available   int64             `json:"available"`
		Description *string           `json:"description"`
		Metadata    map[string]string `json:"metadata"`
		CreatedAt   timestamp         `json:"created_at"`
	}{FormatID(PrefixAccount, a.ID), "account", a.Currency, a.Balance, a.Available(), a.Description, nonNil(a.Metadata), timestamp(a.CreatedAt)})
}

// MarshalJSON renders the deposit as the API shows it.
func (d Deposit) MarshalJSON() ([]byte, error) {
	return marshal(struct {
		ID        string    `json:"id"`
		Object    string    `json:"object"`
		AccountID string    `json:"account_id"`
		Amount    int64     `json:"amount"`
		Currency  string    `json:"currency"`
		CreatedAt timestamp `json:"created_at"`
	}{FormatID(PrefixDeposit, d.ID), "deposit", FormatID(PrefixAccount, d.AccountID), d.Amount, d.Currency, timestamp(d.CreatedAt)})
}

// MarshalJSON renders the charge as the API shows it; a card charge as
// marshalCard does.
func (c Charge) MarshalJSON() ([]byte, error) {
	if c.PaymentMethod != "" {
		return c.marshalCard()
	}
	var failureCode *string
	if c.FailureCode != "" {
		failureCode = &c.FailureCode
	}
	return marshal(struct {
		ID             string            `json:"id"`
		Object         string            `json:"object"`
		AccountID      string            `json:"account_id"`
		Amount         int64             `json:"amount"`
		Currency       string            `json:"currency"`
		Status         ChargeStatus      `json:"status"`
		FailureCode    *string           `json:"failure_code"`
		AmountCaptured int64             `json:"amount_captured"`
		AmountRefunded int64             `json:"amount_refunded"`
		ExpiresAt      *timestamp        `json:"expires_at"`
		Description    *string           `json:"description"`
		Metadata       map[string]string `json:"metadata"`
		CreatedAt      timestamp         `json:"created_at"`
	}{FormatID(PrefixCharge, c.ID), "charge", FormatID(PrefixAccount, c.AccountID), c.Amount, c.Currency,
		c.Status, failureCode, c.AmountCaptured, c.AmountRefunded, (*timestamp)(c.ExpiresAt), c.Description, nonNil(c.Metadata), timestamp(c.CreatedAt)})
}

// marshalCard renders a card charge: it names its payment_method where an
// account's charge names its account_id, and says the processor's
// decline_code.
func (c Charge) marshalCard() ([]byte, error) {
	return marshal(struct {
		ID             string            `json:"id"`
		Object         string            `json:"object"`
		PaymentMethod  string            `json:"payment_method"`
		Amount         int64             `json:"amount"`
		Currency       string            `json:"currency"`
		Status         ChargeStatus      `json:"status"`
		FailureCode    *string           `json:"failure_code"`
		DeclineCode    *string           `json:"decline_code"`
		AmountCaptured int64             `json:"amount_captured"`
		AmountRefunded int64             `json:"amount_refunded"`
		ExpiresAt      *timestamp        `json:"expires_at"`
		Description    *string           `json:"description"`
		Metadata       map[string]string `json:"metadata"`
		CreatedAt      timestamp         `json:"created_at"`
	}{FormatID(PrefixCharge, c.ID), "charge", c.PaymentMethod, c.Amount, c.Currency, c.Status, optional(c.FailureCode), optional(c.DeclineCode),
		c.AmountCaptured, c.AmountRefunded, (*timestamp)(c.ExpiresAt), c.Description, nonNil(c.Metadata), timestamp(c.CreatedAt)})
}

// MarshalJSON renders the refund as the API shows it.
func (r Refund) MarshalJSON() ([]byte, error) {
	if r.Status != "" {
		return r.marshalCard()
	}
	return marshal(struct {
		ID        string    `json:"id"`
		Object    string    `json:"object"`
		ChargeID  string    `json:"charge_id"`
		AccountID string    `json:"account_id"`
		Amount    int64     `json:"amount"`
		Currency  string    `json:"currency"`
		CreatedAt timestamp `json:"created_at"`
	}{FormatID(PrefixRefund, r.ID), "refund", FormatID(PrefixCharge, r.ChargeID), FormatID(PrefixAccount, r.AccountID),
		r.Amount, r.Currency, timestamp(r.CreatedAt)})
}

// marshalCard renders a card charge's refund: it has no account, and says
// its status at the processor.
func (r Refund) marshalCard() ([]byte, error) {
	return marshal(struct {
		ID        string       `json:"id"`
		Object    string       `json:"object"`
		ChargeID  string       `json:"charge_id"`
		Amount    int64        `json:"amount"`
		Currency  string       `json:"currency"`
		Status    RefundStatus `json:"status"`
		CreatedAt timestamp    `json:"created_at"`
	}{FormatID(PrefixRefund, r.ID), "refund", FormatID(PrefixCharge, r.ChargeID), r.Amount, r.Currency, r.Status,
		timestamp(r.CreatedAt)})
}

// MarshalJSON renders the event as the API and the broker show it.
func (e Event) MarshalJSON() ([]byte, error) {
	return marshal(struct {
		ID        string          `json:"id"`
		Object    string          `json:"object"`
		Type      string          `json:"type"`
		CreatedAt timestamp       `json:"created_at"`
		Data      json.RawMessage `json:"data"`
	}{FormatID(PrefixEvent, e.ID), "event", e.Type, timestamp(e.CreatedAt), e.Data})
}

// MarshalJSON renders the page as the API's list object.
func (p Page[T]) MarshalJSON() ([]byte, error) {
	items := p.Items
	if items == nil {
		items = []T{}
	}
	return marshal(struct {
		Object  string `json:"object"`
		Data    []T    `json:"data"`
		HasMore bool   `json:"has_more"`
	}{"list", items, p.HasMore})
}

// optional is s, or nil (null) when it is empty.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
