// Package webhooktest writes the events webhook delivery starts from and
// reads what it recorded, for the tests of the store (internal/postgres) and
// of the Deliverer (internal/webhook). It imports nothing of this module but
// the domain, so that the store's own tests may use it: internal/testkit
// imports the store.
package webhooktest

import (
	"context"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/payment"
)

// Attempt is a row of webhook_attempts as tests compare them: the status the
// receiver answered, or the error that stood for one. Exactly one is set
// (the table's CHECK); a status is never 0.
type Attempt struct {
	Status int
	Error  string
}

// String is the status, or the error quoted, for failure messages.
func (a Attempt) String() string {
	if a.Error != "" {
		return strconv.Quote(a.Error)
	}
	return strconv.Itoa(a.Status)
}

// Querier is what a pool, a connection and a transaction offer.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// AddEvent writes an event of the merchant's as the store does (tx_id and
// seq from their defaults), without the money movement behind it, and
// returns its id.
func AddEvent(t testing.TB, db Querier, merchant uuid.UUID, eventType string) uuid.UUID {
	t.Helper()
	id := payment.NewID()
	if _, err := db.Exec(context.Background(), `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES ($1, $2, 'account', $2, $3, '{"amount":100}')`, merchant, id, eventType); err != nil {
		t.Fatal(err)
	}
	return id
}

// Attempts reads an endpoint's recorded attempts straight from the table,
// oldest first.
func Attempts(t testing.TB, db Querier, endpoint uuid.UUID) []Attempt {
	t.Helper()
	rows, err := db.Query(context.Background(), `
SELECT coalesce(status, 0), coalesce(error, '') FROM webhook_attempts WHERE endpoint_id = $1 ORDER BY attempted_at, id`, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		if err := rows.Scan(&a.Status, &a.Error); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
