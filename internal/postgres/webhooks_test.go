package postgres

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// newMerchant registers a merchant on s for the calling test.
func newMerchant(t testing.TB, s *Store, name string) uuid.UUID {
	t.Helper()
	id, _, err := s.RegisterMerchant(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestWebhookEndpointLifecycle: an endpoint is created with its secret,
// listed and read with exactly its fields and without the secret, seen by no
// other merchant, and after its deletion neither listed, read nor deleted
// again. Its cursor starts at the event horizon of its creation.
func TestWebhookEndpointLifecycle(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.DatabaseURL(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")

	before := time.Now()
	first, err := s.CreateWebhookEndpoint(ctx, acme, "https://acme.example/hooks", []string{payment.AllEvents}, "whsec_first")
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.CreateWebhookEndpoint(ctx, acme, "https://acme.example/charges",
		[]string{payment.EventChargeSucceeded, payment.EventChargeFailed}, "whsec_second")
	if err != nil {
		t.Fatal(err)
	}
	if first.ID == uuid.Nil || first.ID == second.ID || first.MerchantID != acme ||
		first.URL != "https://acme.example/hooks" || !slices.Equal(first.Events, []string{"*"}) ||
		first.Status != payment.WebhookEnabled || first.Secret != "whsec_first" ||
		first.CreatedAt.Before(before.Add(-time.Minute)) || time.Since(first.CreatedAt) > time.Minute {
		t.Fatalf("created %+v", first)
	}
	if second.Secret != "whsec_second" {
		t.Fatalf("created %+v, want its secret", second)
	}
	withoutSecret := func(e payment.WebhookEndpoint) payment.WebhookEndpoint {
		e.Secret = ""
		return e
	}
	same := func(a, b payment.WebhookEndpoint) bool {
		return a.ID == b.ID && a.MerchantID == b.MerchantID && a.URL == b.URL && slices.Equal(a.Events, b.Events) &&
			a.Status == b.Status && a.Secret == b.Secret && a.CreatedAt.Equal(b.CreatedAt)
	}

	list, err := s.WebhookEndpoints(ctx, acme)
	if err != nil || len(list) != 2 || !same(list[0], withoutSecret(first)) || !same(list[1], withoutSecret(second)) {
		t.Fatalf("WebhookEndpoints = %+v, %v; want %+v and %+v without secrets", list, err, first, second)
	}
	got, err := s.WebhookEndpoint(ctx, acme, second.ID)
	if err != nil || !same(got, withoutSecret(second)) {
		t.Fatalf("WebhookEndpoint = %+v, %v; want %+v without its secret", got, err, second)
	}

	// The cursor starts at the horizon read just before the creation, or
	// later; never behind it (it would replay older events).
	h, err := eventHorizon(ctx, s.Pool())
	if err != nil {
		t.Fatal(err)
	}
	third, err := s.CreateWebhookEndpoint(ctx, acme, "https://acme.example/third", []string{"*"}, "whsec_third")
	if err != nil {
		t.Fatal(err)
	}
	var cursorTx, cursorSeq int64
	if err := s.Pool().QueryRow(ctx, `SELECT cursor_tx::text::bigint, cursor_seq FROM webhook_endpoints WHERE merchant_id = $1 AND id = $2`,
		acme, third.ID).Scan(&cursorTx, &cursorSeq); err != nil {
		t.Fatal(err)
	}
	if uint64(cursorTx) < h.xid.Uint64 || cursorSeq != 0 {
		t.Errorf("cursor (%d, %d), want at or after the horizon (%d, 0)", cursorTx, cursorSeq, h.xid.Uint64)
	}

	// Another merchant sees none of them, and cannot delete them.
	if list, err := s.WebhookEndpoints(ctx, globex); err != nil || len(list) != 0 {
		t.Errorf("another merchant lists %+v, %v; want none", list, err)
	}
	if _, err := s.WebhookEndpoint(ctx, globex, first.ID); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("another merchant reads the endpoint: %v, want ErrNotFound", err)
	}
	if err := s.DeleteWebhookEndpoint(ctx, globex, first.ID); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("another merchant deletes the endpoint: %v, want ErrNotFound", err)
	}

	if err := s.DeleteWebhookEndpoint(ctx, acme, first.ID); err != nil {
		t.Fatal(err)
	}
	if list, err := s.WebhookEndpoints(ctx, acme); err != nil || len(list) != 2 || list[0].ID != second.ID || list[1].ID != third.ID {
		t.Errorf("after deleting the first: %+v, %v; want the second and the third", list, err)
	}
	if _, err := s.WebhookEndpoint(ctx, acme, first.ID); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("reading the deleted endpoint: %v, want ErrNotFound", err)
	}
	for name, id := range map[string]uuid.UUID{"the deleted endpoint": first.ID, "an unknown endpoint": uuid.New()} {
		if err := s.DeleteWebhookEndpoint(ctx, acme, id); !errors.Is(err, payment.ErrNotFound) {
			t.Errorf("deleting %s: %v, want ErrNotFound", name, err)
		}
	}
	// Deleted, the row stays: its secret and status are kept, only marked.
	var deleted bool
	if err := s.Pool().QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM webhook_endpoints WHERE merchant_id = $1 AND id = $2`,
		acme, first.ID).Scan(&deleted); err != nil || !deleted {
		t.Errorf("the deleted endpoint's row: deleted %t, %v", deleted, err)
	}

	if _, err := s.CreateWebhookEndpoint(ctx, uuid.New(), "https://nobody.example", []string{"*"}, "whsec_x"); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("creating for an unknown merchant: %v, want ErrNotFound", err)
	}
}

// TestWebhookEndpointLimit releases more creations than the limit allows at
// once: the merchant's row lock serializes them, so exactly
// MaxWebhookEndpoints succeed and the rest are refused; a deletion makes room
// for exactly one more.
func TestWebhookEndpointLimit(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.DatabaseURL(t))
	merchant := newMerchant(t, s, "busy")

	const attempts = payment.MaxWebhookEndpoints + 4
	start := make(chan struct{})
	errs := make([]error, attempts)
	var wg sync.WaitGroup
	for i := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = s.CreateWebhookEndpoint(ctx, merchant, "https://busy.example/hook", []string{"*"}, "whsec_busy")
		}()
	}
	close(start)
	wg.Wait()

	var created, refused int
	for _, err := range errs {
		switch {
		case err == nil:
			created++
		case errors.Is(err, payment.ErrTooManyWebhookEndpoints):
			refused++
		default:
			t.Errorf("creation failed: %v", err)
		}
	}
	if created != payment.MaxWebhookEndpoints || refused != attempts-payment.MaxWebhookEndpoints {
		t.Fatalf("%d created, %d refused; want %d and %d", created, refused, payment.MaxWebhookEndpoints, attempts-payment.MaxWebhookEndpoints)
	}
	list, err := s.WebhookEndpoints(ctx, merchant)
	if err != nil || len(list) != payment.MaxWebhookEndpoints {
		t.Fatalf("%d listed (%v), want %d", len(list), err, payment.MaxWebhookEndpoints)
	}

	if err := s.DeleteWebhookEndpoint(ctx, merchant, list[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateWebhookEndpoint(ctx, merchant, "https://busy.example/again", []string{"*"}, "whsec_again"); err != nil {
		t.Fatalf("after a deletion: %v, want room for one more", err)
	}
	if _, err := s.CreateWebhookEndpoint(ctx, merchant, "https://busy.example/more", []string{"*"}, "whsec_more"); !errors.Is(err, payment.ErrTooManyWebhookEndpoints) {
		t.Errorf("one more after that: %v, want ErrTooManyWebhookEndpoints", err)
	}
}

// TestWebhookEndpointChecks: the table refuses what the domain never
// stores, written directly.
func TestWebhookEndpointChecks(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.DatabaseURL(t))
	merchant := newMerchant(t, s, "checked")
	const insert = `INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, status, cursor_tx)
VALUES ($1, gen_random_uuid(), $2, $3, $4, $5, '1')`
	for _, tc := range []struct {
		name, url  string
		events     []string
		secret     string
		status     string
		constraint string // "" when accepted
	}{
		{"well formed", "https://ok.example", []string{"*"}, "whsec_ok", "enabled", ""},
		{"disabled", "https://ok.example", []string{"*"}, "whsec_ok", "disabled", ""},
		{"secret without whsec_", "https://ok.example", []string{"*"}, "sk_nope", "enabled", "webhook_endpoints_secret_check"},
		{"whsec without the underscore", "https://ok.example", []string{"*"}, "whsecX", "enabled", "webhook_endpoints_secret_check"},
		{"no events", "https://ok.example", []string{}, "whsec_ok", "enabled", "webhook_endpoints_events_check"},
		{"empty URL", "", []string{"*"}, "whsec_ok", "enabled", "webhook_endpoints_url_check"},
		{"unknown status", "https://ok.example", []string{"*"}, "whsec_ok", "paused", "webhook_endpoints_status_check"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Pool().Exec(ctx, insert, merchant, tc.url, tc.events, tc.secret, tc.status)
			if tc.constraint == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != tc.constraint {
				t.Errorf("inserted with %v, want a violation of %s", err, tc.constraint)
			}
		})
	}
}
