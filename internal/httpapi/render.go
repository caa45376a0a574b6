package httpapi

import (
	"encoding/json"
	"net/http"
	"time"

	"payments/internal/idempotency"
	"payments/internal/payment"
)

// response is what a handler answers; for POSTs it is also what is stored under
// the idempotency key and replayed.
type response = idempotency.Response

// timestamp renders times as RFC 3339 in UTC with microseconds, the precision
// PostgreSQL keeps, so a stored body and a later GET agree.
type timestamp time.Time

func (t timestamp) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(t).UTC().Format("2006-01-02T15:04:05.000000Z07:00") + `"`), nil
}

type accountJSON struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Currency    string            `json:"currency"`
	Balance     int64             `json:"balance"`
	Description *string           `json:"description"`
	Metadata    map[string]string `json:"metadata"`
	CreatedAt   timestamp         `json:"created_at"`
}

func renderAccount(a payment.Account) accountJSON {
	return accountJSON{
		ID: payment.FormatID(payment.PrefixAccount, a.ID), Object: "account",
		Currency: a.Currency, Balance: a.Balance, Description: a.Description,
		Metadata: nonNil(a.Metadata), CreatedAt: timestamp(a.CreatedAt),
	}
}

type depositJSON struct {
	ID        string    `json:"id"`
	Object    string    `json:"object"`
	AccountID string    `json:"account_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	CreatedAt timestamp `json:"created_at"`
}

func renderDeposit(d payment.Deposit) depositJSON {
	return depositJSON{
		ID: payment.FormatID(payment.PrefixDeposit, d.ID), Object: "deposit",
		AccountID: payment.FormatID(payment.PrefixAccount, d.AccountID),
		Amount:    d.Amount, Currency: d.Currency, CreatedAt: timestamp(d.CreatedAt),
	}
}

type chargeJSON struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	AccountID      string            `json:"account_id"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency"`
	Status         string            `json:"status"`
	FailureCode    *string           `json:"failure_code"`
	AmountRefunded int64             `json:"amount_refunded"`
	Description    *string           `json:"description"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      timestamp         `json:"created_at"`
}

func renderCharge(c payment.Charge) chargeJSON {
	j := chargeJSON{
		ID: payment.FormatID(payment.PrefixCharge, c.ID), Object: "charge",
		AccountID: payment.FormatID(payment.PrefixAccount, c.AccountID),
		Amount:    c.Amount, Currency: c.Currency, Status: string(c.Status),
		AmountRefunded: c.AmountRefunded, Description: c.Description,
		Metadata: nonNil(c.Metadata), CreatedAt: timestamp(c.CreatedAt),
	}
	if c.FailureCode != "" {
		j.FailureCode = &c.FailureCode
	}
	return j
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// jsonResponse renders v as the response body. The encoding is deterministic
// (struct order, sorted map keys), so equal objects give equal bytes.
func jsonResponse(status int, location string, v any) (response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return response{}, err
	}
	return response{Status: status, Location: location, Body: append(body, '\n')}, nil
}

func created(location string, v any) (response, error) {
	return jsonResponse(http.StatusCreated, location, v)
}
