package procsim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store keeps the simulator's state in PostgreSQL: payments, the actions done
// to them, idempotency keys and webhook events. It is all there is, so the
// simulator survives its own restart.
type Store struct {
	pool *pgxpool.Pool
}

// OpenStore connects to the database at url and creates the simulator's
// tables if they are missing. It returns an error if it cannot connect or
// create them.
func OpenStore(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	s := &Store{pool: pool}
	if err := s.createSchema(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the store's connections.
func (s *Store) Close() { s.pool.Close() }

// schema is idempotent; the advisory lock keeps two simulators starting on
// one database from racing on CREATE.
const schema = `
SELECT pg_advisory_xact_lock(7262411);
CREATE TABLE IF NOT EXISTS procsim_payments (
	psp_reference     text PRIMARY KEY,
	reference         text NOT NULL,
	payment_method    text NOT NULL,
	amount            bigint NOT NULL,
	currency          text NOT NULL,
	capture           boolean NOT NULL,
	status            text NOT NULL,
	decline_code      text NOT NULL DEFAULT '',
	approved_amount   bigint NOT NULL DEFAULT 0,
	captured_amount   bigint NOT NULL DEFAULT 0,
	refunded_amount   bigint NOT NULL DEFAULT 0,
	reversal_refusals int NOT NULL DEFAULT 0,
	created_at        timestamptz NOT NULL,
	updated_at        timestamptz NOT NULL,
	decide_at         timestamptz,
	answered_at       timestamptz
);
CREATE INDEX IF NOT EXISTS procsim_payments_reference ON procsim_payments (reference);
CREATE INDEX IF NOT EXISTS procsim_payments_created ON procsim_payments (created_at, psp_reference);
CREATE INDEX IF NOT EXISTS procsim_payments_pending ON procsim_payments (decide_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS procsim_payments_unanswered ON procsim_payments (created_at)
	WHERE answered_at IS NULL AND status IN ('authorized', 'captured');
CREATE TABLE IF NOT EXISTS procsim_actions (
	id            bigserial PRIMARY KEY,
	psp_reference text NOT NULL REFERENCES procsim_payments,
	kind          text NOT NULL,
	amount        bigint NOT NULL,
	created_at    timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS procsim_actions_payment ON procsim_actions (psp_reference);
CREATE TABLE IF NOT EXISTS procsim_keys (
	key            text PRIMARY KEY,
	fingerprint    bytea NOT NULL,
	status         int NOT NULL,
	body           bytea NOT NULL,
	psp_references text[] NOT NULL,
	created_at     timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS procsim_events (
	id              text PRIMARY KEY,
	payload         bytea NOT NULL,
	created_at      timestamptz NOT NULL,
	attempts        int NOT NULL DEFAULT 0,
	next_attempt_at timestamptz NOT NULL,
	delivered_at    timestamptz
);
CREATE INDEX IF NOT EXISTS procsim_events_due ON procsim_events (next_attempt_at) WHERE delivered_at IS NULL;
`

func (s *Store) createSchema(ctx context.Context) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, schema); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		return nil
	})
}

// inTx runs f in a transaction, committed when f returns nil.
func (s *Store) inTx(ctx context.Context, f func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, f)
}

// Payment is an authorization as the simulator keeps and answers it.
type Payment struct {
	PSPReference   string    `json:"psp_reference"`
	Reference      string    `json:"reference"`
	PaymentMethod  string    `json:"payment_method"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Capture        bool      `json:"capture"`
	Status         string    `json:"status"`
	DeclineCode    string    `json:"decline_code,omitempty"`
	ApprovedAmount int64     `json:"approved_amount"`
	CapturedAmount int64     `json:"captured_amount"`
	RefundedAmount int64     `json:"refunded_amount"`
	CreatedAt      time.Time `json:"created_at"`
	refusals       int
}

// The statuses of a payment.
const (
	StatusPending    = "pending"
	StatusAuthorized = "authorized"
	StatusCaptured   = "captured"
	StatusDeclined   = "declined"
	StatusVoided     = "voided"
	StatusReversed   = "reversed"
	StatusExpired    = "expired" // cancelled by the decision deadline
)

const paymentColumns = `psp_reference, reference, payment_method, amount, currency, capture, status,
	decline_code, approved_amount, captured_amount, refunded_amount, created_at, reversal_refusals`

func scanPayment(row pgx.Row) (Payment, error) {
	var p Payment
	err := row.Scan(&p.PSPReference, &p.Reference, &p.PaymentMethod, &p.Amount, &p.Currency, &p.Capture,
		&p.Status, &p.DeclineCode, &p.ApprovedAmount, &p.CapturedAmount, &p.RefundedAmount, &p.CreatedAt, &p.refusals)
	p.CreatedAt = p.CreatedAt.UTC()
	return p, err
}

func collectPayments(rows pgx.Rows) ([]Payment, error) {
	defer rows.Close()
	var out []Payment
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// errNotFound is a payment that does not exist.
var errNotFound = errors.New("payment not found")

const insertPayment = `
INSERT INTO procsim_payments (psp_reference, reference, payment_method, amount, currency, capture, status,
	decline_code, approved_amount, captured_amount, created_at, updated_at, decide_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $12)`

func createPayment(ctx context.Context, tx pgx.Tx, p Payment, decideAt *time.Time) error {
	_, err := tx.Exec(ctx, insertPayment, p.PSPReference, p.Reference, p.PaymentMethod, p.Amount, p.Currency,
		p.Capture, p.Status, p.DeclineCode, p.ApprovedAmount, p.CapturedAmount, p.CreatedAt, decideAt)
	if err != nil {
		return fmt.Errorf("insert payment: %w", err)
	}
	return nil
}

const updatePayment = `
UPDATE procsim_payments SET status = $2, approved_amount = $3, captured_amount = $4, refunded_amount = $5,
	reversal_refusals = $6, updated_at = $7
WHERE psp_reference = $1`

func savePayment(ctx context.Context, tx pgx.Tx, p Payment, now time.Time) error {
	_, err := tx.Exec(ctx, updatePayment, p.PSPReference, p.Status, p.ApprovedAmount, p.CapturedAmount,
		p.RefundedAmount, p.refusals, now)
	if err != nil {
		return fmt.Errorf("update payment: %w", err)
	}
	return nil
}

func lockPayment(ctx context.Context, tx pgx.Tx, psp string) (Payment, error) {
	p, err := scanPayment(tx.QueryRow(ctx,
		`SELECT `+paymentColumns+` FROM procsim_payments WHERE psp_reference = $1 FOR UPDATE`, psp))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, errNotFound
	}
	return p, err
}

func lockPaymentsByReference(ctx context.Context, tx pgx.Tx, ref string) ([]Payment, error) {
	rows, err := tx.Query(ctx, `SELECT `+paymentColumns+` FROM procsim_payments
		WHERE reference = $1 ORDER BY psp_reference FOR UPDATE`, ref)
	if err != nil {
		return nil, err
	}
	return collectPayments(rows)
}

// Action kinds, as the audit counts them.
const (
	actionAuthorize       = "authorize"
	actionDecline         = "decline"
	actionCapture         = "capture"
	actionVoid            = "void"
	actionRefund          = "refund"
	actionReversal        = "reversal"
	actionReversalRefused = "reversal_refused"
	actionExpire          = "expire"
)

func recordAction(ctx context.Context, tx pgx.Tx, psp, kind string, amount int64, now time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO procsim_actions (psp_reference, kind, amount, created_at)
		VALUES ($1, $2, $3, $4)`, psp, kind, amount, now)
	if err != nil {
		return fmt.Errorf("insert action: %w", err)
	}
	return nil
}

// markReferenceAnswered is markAnswered for every payment carrying our
// reference ref.
func (s *Store) markReferenceAnswered(ctx context.Context, ref string, now time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE procsim_payments SET answered_at = $2
		WHERE reference = $1 AND answered_at IS NULL`, ref, now)
	return err
}

// markAnswered records that an answer naming these payments was delivered, so
// the decision deadline leaves them alone.
func (s *Store) markAnswered(ctx context.Context, psps []string, now time.Time) error {
	if len(psps) == 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, `UPDATE procsim_payments SET answered_at = $2
		WHERE psp_reference = ANY($1) AND answered_at IS NULL`, psps, now)
	return err
}

// Get returns the payment psp, or errNotFound.
func (s *Store) Get(ctx context.Context, psp string) (Payment, error) {
	p, err := scanPayment(s.pool.QueryRow(ctx,
		`SELECT `+paymentColumns+` FROM procsim_payments WHERE psp_reference = $1`, psp))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, errNotFound
	}
	return p, err
}

// ByReference returns the payments carrying our reference ref, oldest first.
func (s *Store) ByReference(ctx context.Context, ref string) ([]Payment, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+paymentColumns+` FROM procsim_payments
		WHERE reference = $1 ORDER BY created_at, psp_reference`, ref)
	if err != nil {
		return nil, err
	}
	return collectPayments(rows)
}

// dbNow is the clock of one write, at PostgreSQL's precision, so an answer
// shows the same instant a later read of its row does.
func dbNow() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
