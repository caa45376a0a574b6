package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/testkit"
)

// failoverWitness is the side of a failover scenario that is shown things
// rather than told them: a reader that lists the merchant's charges and notes
// each one a 200 showed it, an operator who revokes API keys one after another
// with the binary's api-keys revoke, retrying each until it reports success or
// "already revoked", and the worked-example consumer (payments consume), which
// acknowledges an event to NATS once its effect committed. After the failover,
// on the promoted standby, nothing any of them was shown may be missing: no
// charge a read listed, no revocation reported, no effect acknowledged (the
// projection catches up with the ledger). The methods of a nil
// *failoverWitness do nothing.
type failoverWitness struct {
	s   *scenario
	c   *client
	bin string
	env []string // the binary's environment for api-keys and consume

	consumer     *exec.Cmd
	consumerLogs *testkit.LogBuffer

	mu    sync.Mutex
	shown map[string]string // charge id → its status, as a read showed it

	reads, readsUnavailable atomic.Int64

	keys          []string          // key ids to revoke, in turn
	revoked       map[string]string // key id → what revoke reported: "revoked" or "already revoked"
	revokeRetries atomic.Int64      // revocations that failed and were tried again
}

// startSides starts what sc adds to a failover scenario beside its
// charging clients: the webhook side (sc.webhooks) and the witness
// (sc.witness); each nil when not wanted.
func startSides(t *testing.T, sc failoverScenario, s *scenario, c *client, svc *service, natsURL string) (*failoverHooks, *failoverWitness) {
	t.Helper()
	var (
		hooks *failoverHooks
		wit   *failoverWitness
	)
	if sc.webhooks {
		hooks = startHooks(t, s, c, svc)
	}
	if sc.witness {
		wit = startWitness(t, s, c, s.dbURL, natsURL)
	}
	return hooks, wit
}

// plus is f and g together, as one side's figures.
func (f hookFigures) plus(g hookFigures) hookFigures {
	return hookFigures{requests: f.requests + g.requests, faults: f.faults + g.faults,
		lost: f.lost + g.lost, violations: f.violations + g.violations}
}

// witnessKeys is how many keys the operator has to revoke, one every
// revokeEvery at the most: enough to go on past the fault in either form
// (a CHAOS_LONG run whose operator was done 20 s before it saw no failed
// revocation at all).
const witnessKeys = 60

var revokeEvery = scale(50*time.Millisecond, 700*time.Millisecond)

// startWitness makes the keys to revoke and starts the consumer; read and
// revoke start the clients.
func startWitness(t *testing.T, s *scenario, c *client, dbURL, natsURL string) *failoverWitness {
	t.Helper()
	w := &failoverWitness{s: s, c: c, bin: s.bin, shown: map[string]string{}, revoked: map[string]string{},
		env: []string{"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "COMMIT_WAIT=2s",
			"METRICS_ADDR=127.0.0.1:0", "LOG_LEVEL=info"}}
	for range witnessKeys {
		var k struct {
			KeyID string `json:"key_id"`
		}
		out := payments(t, s.bin, w.env, "api-keys", "create", "--merchant", s.merchants[0].ID)
		if err := json.Unmarshal(out, &k); err != nil || k.KeyID == "" {
			t.Fatalf("api-keys create printed %q (%v)", out, err)
		}
		w.keys = append(w.keys, k.KeyID)
	}
	w.consumerLogs = &testkit.LogBuffer{}
	w.consumer = exec.Command(s.bin, "consume")
	w.consumer.Env = w.env
	w.consumer.Stdout, w.consumer.Stderr = w.consumerLogs, w.consumerLogs
	w.consumer.WaitDelay = 5 * time.Second
	dieWithParent(w.consumer)
	must(t, w.consumer.Start(), "payments consume")
	t.Cleanup(func() {
		_ = w.consumer.Process.Kill()
		_ = w.consumer.Wait()
	})
	return w
}

// run starts the reader and the operator until stop closes; wg counts them.
func (w *failoverWitness) run(ctx context.Context, stop <-chan struct{}, wg *sync.WaitGroup) {
	if w == nil {
		return
	}
	wg.Go(func() { w.read(ctx, stop) })
	wg.Go(func() { w.revoke(ctx, stop) })
}

// read lists the merchant's newest charges every 20 ms.
func (w *failoverWitness) read(ctx context.Context, stop <-chan struct{}) {
	for pause(ctx, stop, 20*time.Millisecond) {
		a, err := w.c.send(ctx, 1, http.MethodGet, "/v1/charges?limit=100", "", nil)
		w.reads.Add(1)
		if err != nil || a.status != http.StatusOK {
			if err == nil && a.status == http.StatusServiceUnavailable {
				w.readsUnavailable.Add(1)
			}
			continue
		}
		var page struct {
			Data []struct {
				ID     string `json:"id"`
				Status string `json:"status"`
			} `json:"data"`
		}
		if err := json.Unmarshal(a.body, &page); err != nil {
			continue
		}
		w.mu.Lock()
		for _, ch := range page.Data {
			w.shown[ch.ID] = ch.Status
		}
		w.mu.Unlock()
	}
}

// revoke revokes the keys one after another, each until revoke reports
// success or "already revoked".
func (w *failoverWitness) revoke(ctx context.Context, stop <-chan struct{}) {
	for _, key := range w.keys {
		for {
			if !pause(ctx, stop, revokeEvery) {
				return
			}
			outcome, err := w.revokeOnce(ctx, key)
			if err == nil {
				w.mu.Lock()
				w.revoked[key] = outcome
				w.mu.Unlock()
				break
			}
			w.revokeRetries.Add(1)
		}
	}
}

// pause waits d, and reports false instead when stop closes or ctx ends
// first.
func pause(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	select {
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// revokeOnce runs payments api-keys revoke once.
func (w *failoverWitness) revokeOnce(ctx context.Context, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, w.bin, "api-keys", "revoke", key)
	cmd.Env, cmd.Stderr = w.env, &stderr
	switch err := cmd.Run(); {
	case err == nil:
		return "revoked", nil
	case strings.Contains(stderr.String(), "already revoked"):
		return "already revoked", nil
	default:
		return "", errors.New(stderr.String())
	}
}

// judge holds what the witness was shown against the database (the
// promoted standby): every charge a read showed, with the status shown or
// a later one; every revocation reported; and the projection, once the
// consumer has caught up, equal to the ledger for every account.
func (w *failoverWitness) judge(t *testing.T, ctx context.Context, db *pgxpool.Pool) hookFigures {
	t.Helper()
	if w == nil {
		return hookFigures{}
	}
	var f hookFigures
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, status := range w.shown {
		uid, ok := payment.ParseID(payment.PrefixCharge, id)
		if !ok {
			t.Errorf("a read showed the charge id %q", id)
			f.violations++
			continue
		}
		var now string
		err := db.QueryRow(ctx, `SELECT status FROM charges WHERE id = $1`, uid).Scan(&now)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			f.lost++
			if f.lost <= 10 {
				t.Errorf("a read showed the charge %s (%s), which the database lost", id, status)
			}
		case err != nil:
			t.Fatal(err)
		}
	}
	for key, outcome := range w.revoked {
		var revoked bool
		if err := db.QueryRow(ctx, `SELECT revoked_at IS NOT NULL FROM api_keys WHERE id = $1`, key).Scan(&revoked); err != nil {
			t.Fatal(err)
		}
		if !revoked {
			f.lost++
			t.Errorf("api-keys revoke reported %s for %s, which the database has not revoked", outcome, key)
		}
	}
	apart := w.awaitProjection(t, ctx, db)
	f.lost += apart
	_ = w.consumer.Process.Kill()
	t.Logf("witness: %d reads (%d answered 503) showed %d charges; %d of %d keys reported revoked, after %d failed tries; "+
		"%d accounts whose projection never matched the ledger",
		w.reads.Load(), w.readsUnavailable.Load(), len(w.shown), len(w.revoked), len(w.keys), w.revokeRetries.Load(), apart)
	f.requests = w.reads.Load()
	f.faults = "; reads, api-keys revoke and the consumer alongside"
	if len(w.revoked) == 0 {
		t.Error("no revocation was reported: the operator's side of the scenario did nothing")
		f.violations++
	}
	return f
}

// awaitProjection waits up to a minute until the consumer's projection of
// every account of the merchant equals its balance, and returns how many
// still differ then.
func (w *failoverWitness) awaitProjection(t *testing.T, ctx context.Context, db *pgxpool.Pool) int {
	t.Helper()
	const apartSQL = `
SELECT a.id, a.balance, p.balance
FROM accounts a LEFT JOIN account_balances p ON p.merchant_id = a.merchant_id AND p.account_id = a.id
WHERE a.merchant_id = $1 AND p.balance IS DISTINCT FROM a.balance`
	var lines []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		rows, err := db.Query(ctx, apartSQL, w.s.merchants[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		lines = lines[:0]
		for rows.Next() {
			var (
				id        [16]byte
				ledger    int64
				projected *int64
			)
			if err := rows.Scan(&id, &ledger, &projected); err != nil {
				t.Fatal(err)
			}
			p := "none"
			if projected != nil {
				p = itoa(*projected)
			}
			lines = append(lines, "ledger "+itoa(ledger)+", projected "+p)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(lines) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(lines) > 0 {
		t.Errorf("%d accounts' projection still apart from the ledger a minute on (%s); the consumer's log ends:\n%s",
			len(lines), strings.Join(lines, "; "), w.consumerLogs.Tail(3000))
	}
	return len(lines)
}
