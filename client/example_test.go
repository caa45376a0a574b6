package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/exactlyonce/payments/client"
)

// The examples need a running service (make run) and an API key; they are
// compiled by go test, not run.

func ExampleNew() {
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"),
		// Each attempt gets 10 s; the operation as a whole up to 5 attempts in 20 s.
		client.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}),
		client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 5, MaxElapsed: 20 * time.Second}),
	)
	_ = c
}

func ExampleClient_CreateCharge() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))

	res, err := c.CreateCharge(ctx, client.NewCharge{
		AccountID: "acct_4a5f3df99a5d518c03adf918c80d03ef",
		Amount:    500, // 5.00 USD
		Currency:  "USD",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Data.ID, res.Data.Status, "after", res.Attempts, "attempt(s), request ids", res.RequestIDs)
}

// A key of your own, saved with the order before the charge is sent, lets a
// restarted process finish the operation: the service replays its outcome
// rather than charging twice.
func ExampleClient_CreateCharge_replay() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))
	in := client.NewCharge{AccountID: "acct_4a5f3df99a5d518c03adf918c80d03ef", Amount: 500, Currency: "USD"}
	key := "order-1042" // stored with the order before the first attempt

	first, err := c.CreateCharge(ctx, in, client.WithIdempotencyKey(key))
	if err != nil {
		log.Fatal(err)
	}
	// ... the process crashes before it records the outcome, restarts, and
	// sends the same operation again:
	again, err := c.CreateCharge(ctx, in, client.WithIdempotencyKey(key))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Data.ID == again.Data.ID, again.Replayed) // true true
}

// A refusal is a *client.Problem: switch on its Code. It is returned at once,
// never retried; an insufficient-funds refusal records a failed charge.
func ExampleClient_CreateCharge_insufficientFunds() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))

	_, err := c.CreateCharge(ctx, client.NewCharge{AccountID: "acct_4a5f3df99a5d518c03adf918c80d03ef", Amount: 99_999_999, Currency: "USD"})
	var p *client.Problem
	switch {
	case err == nil:
		fmt.Println("charged")
	case errors.As(err, &p) && p.Code == client.CodeInsufficientFunds:
		fmt.Println("declined: the failed charge is", p.ChargeID)
	case errors.Is(err, client.ErrGaveUp):
		// Uncertain: the charge may have happened. Retry later with the
		// same key to learn its outcome.
		fmt.Println("no answer yet:", err)
	default:
		fmt.Println("refused:", err)
	}
}

func ExampleClient_CreateRefund() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))

	amount := int64(200) // leave Amount nil to refund what is left
	res, err := c.CreateRefund(ctx, "ch_0097748e0b70e31f14e42883ee36d0e5", client.NewRefund{Amount: &amount})
	var p *client.Problem
	if errors.As(err, &p) && p.Code == client.CodeRefundExceedsCharge {
		fmt.Println("nothing that much left to refund")
		return
	} else if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Data.ID, res.Data.Amount)
}

// Authorize now, capture later: CreateCharge with Capture false holds the
// amount; Capture takes all or part of it, Void releases it. An authorization
// not captured by its ExpiresAt expires, and a capture then is refused with
// charge-not-capturable and ChargeStatus "expired".
func ExampleClient_Capture() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))

	capture := false
	auth, err := c.CreateCharge(ctx, client.NewCharge{
		AccountID: "acct_4a5f3df99a5d518c03adf918c80d03ef",
		Amount:    3_000, // held, not taken: the account's Available drops, its Balance does not
		Currency:  "USD",
		Capture:   &capture,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(auth.Data.Status, "until", auth.Data.ExpiresAt) // authorized until ...

	// The order shipped without one item: take 25.00, release the rest.
	amount := int64(2_500)
	res, err := c.Capture(ctx, auth.Data.ID, client.CaptureCharge{Amount: &amount})
	var p *client.Problem
	switch {
	case errors.As(err, &p) && p.Code == client.CodeChargeNotCapturable:
		fmt.Println("too late: the charge is", p.ChargeStatus) // expired, voided, ...
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(res.Data.Status, res.Data.AmountCaptured) // succeeded 2500
	}
}

// Void releases an authorization's whole hold; no money moves.
func ExampleClient_Void() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))

	res, err := c.Void(ctx, "ch_5b1e0c2a9f8d4e3b7a6c1d2e3f4a5b6c")
	var p *client.Problem
	if errors.As(err, &p) && p.Code == client.CodeChargeNotVoidable {
		fmt.Println("not an authorization any more:", p.ChargeStatus)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Data.Status) // voided
}

// Charges pages through the list for you; ListCharges reads one page.
func ExampleClient_Charges() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))

	account, limit := "acct_4a5f3df99a5d518c03adf918c80d03ef", 100
	for ch, err := range c.Charges(ctx, client.ListChargesParams{AccountID: &account, Limit: &limit}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ch.ID, ch.Amount, ch.Status, ch.AmountRefunded)
	}
}

// The event feed, oldest first, read page by page from a saved position.
func ExampleClient_ListEvents() {
	ctx := context.Background()
	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))

	var after *string // the id of the last event handled, saved between runs
	for {
		page, err := c.ListEvents(ctx, client.ListEventsParams{StartingAfter: after})
		if err != nil {
			log.Fatal(err)
		}
		for _, e := range page.Data.Data {
			if e.Type == client.EventTypeChargeSucceeded {
				ch, err := e.Data.AsCharge()
				if err != nil {
					log.Fatal(err)
				}
				fmt.Println(e.ID, ch.ID, ch.Amount)
			}
			after = &e.ID
		}
		if !page.Data.HasMore {
			return
		}
	}
}

// A webhook receiver: read the body as sent, verify and parse it, and
// deduplicate on the event's id, which the signature covers (a delivery may
// come more than once). The Payments-Event-Id header is not signed: never
// deduplicate on it.
func ExampleParseWebhook() {
	secret := os.Getenv("PAYMENTS_WEBHOOK_SECRET") // "whsec_...", shown once when the endpoint was created
	var (
		mu   sync.Mutex
		seen = map[client.EventID]bool{} // in production: a unique key in your database, written with the effect
	)
	http.HandleFunc("POST /webhooks/payments", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		ev, err := client.ParseWebhook(body, r.Header.Get(client.WebhookSignatureHeader), secret, 0)
		if err != nil {
			http.Error(w, "bad delivery", http.StatusBadRequest)
			return
		}
		mu.Lock()
		again := seen[ev.ID]
		seen[ev.ID] = true
		mu.Unlock()
		if !again {
			log.Println("event", ev.ID, ev.Type)
		}
		w.WriteHeader(http.StatusNoContent) // any 2xx acknowledges it, a duplicate's too
	})
	log.Fatal(http.ListenAndServe(":8000", nil))
}

// A receiver's unit test: sign a payload of your own as the service would,
// and hand it to your handler.
func ExampleSignWebhook() {
	const secret = "whsec_test_secret" // a secret of your test's own
	body := []byte(`{"id":"evt_0190c0d5a1b27c3e8f4d6a5b4c3d2e1f","object":"event","type":"charge.succeeded",` +
		`"created_at":"2026-11-30T12:02:00.654321Z","data":{"object":"charge"}}`)
	req := httptest.NewRequest(http.MethodPost, "/webhooks/payments", bytes.NewReader(body))
	req.Header.Set(client.WebhookSignatureHeader, client.SignWebhook(secret, time.Now(), body))

	// What your handler does with it:
	ev, err := client.ParseWebhook(body, req.Header.Get(client.WebhookSignatureHeader), secret, 0)
	fmt.Println(ev.ID, ev.Type, err)
	// Output: evt_0190c0d5a1b27c3e8f4d6a5b4c3d2e1f charge.succeeded <nil>
}
