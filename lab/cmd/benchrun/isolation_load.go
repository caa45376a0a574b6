package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// isoWorld is one mode's service and its two merchants: A, the noisy one,
// and B, whose charges are measured.
type isoWorld struct {
	url, database string
	a, b          benchrun.Merchant
	accountA      string // acct_…
	accountB      string
	http          *http.Client
}

// open makes each merchant's account: A's with charges for its readers to
// list, B's with money for every charge of the run.
func (w *isoWorld) open(ctx context.Context) error {
	w.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	var err error
	if w.accountA, err = w.newAccount(ctx, w.a.APIKey, "EUR", 1); err != nil {
		return err
	}
	if w.accountB, err = w.newAccount(ctx, w.b.APIKey, "USD", 10); err != nil {
		return err
	}
	for range 20 {
		if st, _, err := w.charge(ctx, w.a.APIKey, w.accountA, "EUR"); err != nil || st != http.StatusCreated {
			return fmt.Errorf("a charge of merchant A: %d %w", st, err)
		}
	}
	return nil
}

// newAccount opens an account in currency with deposits of the most a
// deposit may be.
func (w *isoWorld) newAccount(ctx context.Context, apiKey, currency string, deposits int) (string, error) {
	st, body, err := w.post(ctx, apiKey, "/v1/accounts", `{"currency":"`+currency+`"}`)
	var acct struct{ ID string }
	if err != nil || st != http.StatusCreated || json.Unmarshal(body, &acct) != nil {
		return "", fmt.Errorf("open an account: %d %w %s", st, err, body)
	}
	for range deposits {
		if st, body, err := w.post(ctx, apiKey, "/v1/accounts/"+acct.ID+"/deposits", `{"amount":99999999}`); err != nil || st != http.StatusCreated {
			return "", fmt.Errorf("deposit: %d %w %s", st, err, body)
		}
	}
	return acct.ID, nil
}

func (w *isoWorld) charge(ctx context.Context, apiKey, account, currency string) (int, []byte, error) {
	return w.post(ctx, apiKey, "/v1/charges", `{"account_id":"`+account+`","amount":1,"currency":"`+currency+`"}`)
}

// post sends body under a fresh Idempotency-Key.
func (w *isoWorld) post(ctx context.Context, apiKey, path, body string) (int, []byte, error) {
	var k [16]byte
	_, _ = rand.Read(k[:])
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url+path, bytes.NewBufferString(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", hex.EncodeToString(k[:]))
	return w.do(req, apiKey)
}

func (w *isoWorld) do(req *http.Request, apiKey string) (int, []byte, error) {
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := w.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// phaseResult is one phase: B's charges and A's reads.
type phaseResult struct {
	round, readers int
	seconds        float64
	latencies      []float64   // B's charges, ms
	charges        map[int]int // B's answers by status (0: no answer)
	reads          map[int]int // A's answers by status
}

// refused counts B's answers that are not 201.
func (p phaseResult) refused() int {
	n := 0
	for st, c := range p.charges {
		if st != http.StatusCreated {
			n += c
		}
	}
	return n
}

func (p phaseResult) p50() string { return benchrun.Percentiles(p.latencies, 0.5)[0] }

func (p phaseResult) line() string {
	q := benchrun.Percentiles(p.latencies, 0.5, 0.99)
	return fmt.Sprintf("%d readers: B %d charges (p50 %s ms, p99 %s ms), %d refused; A's reads %v", p.readers,
		p.charges[http.StatusCreated], q[0], q[1], p.refused(), p.reads)
}

// paced runs clients of B charging rate times a second in all, each on a
// schedule of its own (a charge slower than its interval makes the next
// start at once), until ctx is done, and reports each answer (status 0:
// none) with its time.
func (w *isoWorld) paced(ctx context.Context, clients int, rate float64, answer func(status int, took time.Duration)) {
	interval := time.Duration(float64(clients) / rate * float64(time.Second))
	var cg sync.WaitGroup
	for range clients {
		cg.Go(func() {
			next := time.Now()
			for ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				start := time.Now()
				st, _, err := w.charge(context.WithoutCancel(ctx), w.b.APIKey, w.accountB, "USD")
				if err != nil {
					st = 0
				}
				answer(st, time.Since(start))
				if next = next.Add(interval); time.Since(next) > interval {
					next = time.Now() // behind: no burst to catch up
				}
			}
		})
	}
	cg.Wait()
}

// phase runs chargers clients of B charging rate times a second in all
// for d, and readers clients of A reading at full speed from half a second
// before until B's clients stop.
func (w *isoWorld) phase(ctx context.Context, chargers, readers int, rate float64, d time.Duration) phaseResult {
	p := phaseResult{readers: readers, charges: map[int]int{}, reads: map[int]int{}, seconds: d.Seconds()}
	var mu sync.Mutex
	readCtx, stopReads := context.WithCancel(ctx)
	var rg sync.WaitGroup
	for range readers {
		rg.Go(func() {
			for readCtx.Err() == nil {
				req, err := http.NewRequestWithContext(readCtx, http.MethodGet, w.url+"/v1/charges?limit=10", nil)
				if err != nil {
					return
				}
				st, _, _ := w.do(req, w.a.APIKey)
				mu.Lock()
				p.reads[st]++
				mu.Unlock()
			}
		})
	}
	if readers > 0 {
		time.Sleep(500 * time.Millisecond)
	}
	chargeCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	w.paced(chargeCtx, chargers, rate, func(st int, took time.Duration) {
		mu.Lock()
		p.charges[st]++
		if st == http.StatusCreated {
			p.latencies = append(p.latencies, float64(took.Microseconds())/1000)
		}
		mu.Unlock()
	})
	stopReads()
	rg.Wait()
	return p
}

// holdsResult is the holds' expiry: how long the sweep took and how late
// B's events were meanwhile.
type holdsResult struct {
	holds  int
	sweep  time.Duration // from the holds' expiry until none is left
	delays []float64     // of B's charge.succeeded events, ms
	late   int           // of them over 1 s
}

func (h holdsResult) line() string {
	q := benchrun.Percentiles(h.delays, 0.5, 0.99, 1)
	return fmt.Sprintf("%d holds expired in %.1f s; B's %d events: p50 %s ms, p99 %s ms, max %s ms, %d over 1 s",
		h.holds, h.sweep.Seconds(), len(h.delays), q[0], q[1], q[2], h.late)
}

// expireHolds writes holds one-cent authorizations on A's account, by
// SQL, all expiring at one moment a few seconds after they are written,
// and times B's events from then until the sweep has expired them all.
func (w *isoWorld) expireHolds(ctx context.Context, holds, chargers int, rate float64, natsURL string) (holdsResult, error) {
	res := holdsResult{holds: holds}
	const seed = `
WITH a AS (SELECT merchant_id, id FROM accounts WHERE currency = 'EUR'),
ins AS (
    INSERT INTO charges (merchant_id, id, account_id, amount, currency, status, expires_at)
    SELECT a.merchant_id, gen_random_uuid(), a.id, 1, 'EUR', 'authorized', $2::timestamptz
    FROM a, generate_series(1, $1::int)
)
UPDATE accounts SET held = held + $1::int WHERE (merchant_id, id) IN (SELECT merchant_id, id FROM a)`
	expireAt := time.Now().Add(time.Minute) // past the seeding, rewritten below
	if _, err := benchrun.Value(ctx, w.database, seed+` RETURNING 1`, holds, expireAt); err != nil {
		return res, fmt.Errorf("write %d holds: %w", holds, err)
	}
	if err := benchrun.Exec(ctx, w.database, "VACUUM ANALYZE charges", "CHECKPOINT"); err != nil {
		return res, err
	}
	nc, err := nats.Connect(natsURL, nats.Name("bench-isolation"))
	if err != nil {
		return res, err
	}
	defer nc.Close()
	var mu sync.Mutex
	sub, err := nc.Subscribe("payments.charge.succeeded", func(m *nats.Msg) {
		at := time.Now()
		var e struct {
			CreatedAt time.Time `json:"created_at"`
		}
		if json.Unmarshal(m.Data, &e) != nil || e.CreatedAt.IsZero() {
			return
		}
		mu.Lock()
		res.delays = append(res.delays, float64(at.Sub(e.CreatedAt).Microseconds())/1000)
		mu.Unlock()
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err != nil {
		return res, err
	}
	// The holds expire 5 s from now; B charges from now until the sweep has
	// recorded them all, and a second more.
	expireAt = time.Now().Add(5 * time.Second)
	if err := benchrun.Exec(ctx, w.database, fmt.Sprintf(
		"UPDATE charges SET expires_at = '%s' WHERE status = 'authorized' AND currency = 'EUR'", expireAt.UTC().Format(time.RFC3339Nano)),
		"VACUUM ANALYZE charges"); err != nil {
		return res, err
	}
	chargeCtx, stop := context.WithCancel(ctx)
	charged := make(chan struct{})
	go func() {
		w.paced(chargeCtx, chargers, rate, func(int, time.Duration) {})
		close(charged)
	}()
	err = w.awaitSwept(ctx, expireAt, &res)
	time.Sleep(time.Second)
	stop()
	<-charged
	time.Sleep(2 * time.Second) // the last events reach the subscriber
	mu.Lock()
	for _, d := range res.delays {
		if d > 1000 {
			res.late++
		}
	}
	mu.Unlock()
	return res, err
}

// awaitSwept polls, every 100 ms, until no authorization of A is left, for
// five minutes at most, and notes how long after expireAt that was.
func (w *isoWorld) awaitSwept(ctx context.Context, expireAt time.Time, res *holdsResult) error {
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		left, err := benchrun.Value(ctx, w.database, `SELECT count(*) FROM charges WHERE status = 'authorized' AND currency = 'EUR'`)
		if err != nil {
			return err
		}
		if n, _ := strconv.Atoi(left); n == 0 && time.Now().After(expireAt) {
			res.sweep = time.Since(expireAt)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the sweep left holds after five minutes")
}
