package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/webhook"
)

// floodHeaderBytes is how much header a flooding receiver answers with: 9
// MiB, just under the 10 MiB Go's HTTP client reads by default.
const floodHeaderBytes = 9 << 20

// memoryMargin is what a replica's resident memory may grow by, over its
// idle size, while its Deliverer works on endpoints that answer
// floodHeaderBytes of headers: 88 MiB in all on the development machine,
// which idles at 24 MiB. An attempt that reads a bounded header (16 KiB)
// needs little: this test's load on endpoints answering 16 KiB of headers
// took the process from 24 to 33 MiB there (2026-12-06). Reading whole 9 MiB
// headers, 32 at once, took it to 557-625 MiB.
const memoryMargin = 64 << 20

// TestWebhookHugeHeadersMemoryBounded is endpoints that answer with a flood
// of headers: two merchants have 8 webhook endpoints each on a receiver that
// answers every delivery "204 No Content" preceded by 9 MiB of header lines,
// written over about 3 s (within the 10 s timeout), and a backlog of 20
// events each (40 in the long version) that they keep adding to, one charge
// each every 500 ms. For 25 s (60 s) the test reads the service's resident
// memory every 100 ms; its peak (VmHWM) must stay within memoryMargin of what
// it was idle, before the backlog. Each attempt on those endpoints must be
// recorded as failed, with an error that names the headers, and no delivery
// delivered.
func TestWebhookHugeHeadersMemoryBounded(t *testing.T) {
	var (
		backlog = scale(20, 40)
		window  = scale(25*time.Second, 60*time.Second)
	)
	s := startScenario(t, scale(2*time.Minute, 5*time.Minute), testDatabase, "flood-one", "flood-two")
	ctx := s.ctx
	svc := newService(t, s.bin, serviceConfig{databaseURL: s.dbURL, extra: []string{"WEBHOOK_ALLOW_PRIVATE_NETWORKS=true"}})
	idle, _, err := memoryOf(svc.pid())
	if errors.Is(err, errNoProcfs) {
		t.Skipf("cannot read the service's memory: %v", err)
	}
	must(t, err, "read the service's memory")

	flood := newHeaderFlood(t, floodHeaderBytes, 3*time.Second)
	floodURL := flood.listen(t, "127.0.0.1:0").URL
	type tenant struct {
		c       *client
		account string
		ops     []op
	}
	var (
		tenants []*tenant
		hooks   []hookEndpoint
	)
	for i, m := range s.merchants {
		c := newClient(t, m.APIKey, fmt.Sprintf("flood-%d-", i), func(int) string { return svc.url() })
		for j := range maxEndpoints / 2 {
			hooks = append(hooks, mustEndpoint(t, ctx, c, m, &flood.recv, floodURL, fmt.Sprintf("/m%d-%02d", i, j), "*"))
		}
		tenants = append(tenants, &tenant{c: c, account: c.mustAccount(t, ctx, usd)})
	}
	charge := func(tn *tenant) {
		amount := 1 + rand.Int64N(500)
		tn.ops = append(tn.ops, mustDrive(t, ctx, tn.c, op{kind: "charge", path: "/v1/charges", account: tn.account,
			amount: amount, body: chargeBody(tn.account, amount)}, http.StatusCreated))
	}
	for _, tn := range tenants {
		tn.ops = append(tn.ops, mustDrive(t, ctx, tn.c, depositOp(tn.account, 10_000_000), http.StatusCreated))
		for range backlog - 2 {
			charge(tn)
		}
	}

	// The window: the backlog is worked on, both merchants add to it, and
	// the service's memory is read every 100 ms.
	began := time.Now()
	var maxRSS int64
	for next := began; time.Since(began) < window; next = next.Add(100 * time.Millisecond) {
		time.Sleep(time.Until(next))
		if next.Sub(began)%(500*time.Millisecond) == 0 {
			for _, tn := range tenants {
				charge(tn)
			}
		}
		rss, _, err := memoryOf(svc.pid())
		must(t, err, "read the service's memory")
		maxRSS = max(maxRSS, rss)
	}
	_, peak, err := memoryOf(svc.pid())
	must(t, err, "read the service's memory")
	held := flood.maxInFlight()
	svc.stop()

	if peak > idle+memoryMargin {
		t.Errorf("the service's resident memory peaked at %d MiB (VmHWM; %d MiB the most read every 100 ms), idle %d MiB: "+
			"more than the %d MiB it may grow by, with %d requests answering %d MiB of headers at once",
			peak>>20, maxRSS>>20, idle>>20, memoryMargin>>20, held, floodHeaderBytes>>20)
	}
	out := floodOutcomes(t, ctx, s.db)
	if out.attempts == 0 {
		t.Error("no attempt to the flooding endpoints was recorded")
	}
	if out.namingHeaders != out.attempts || out.delivered > 0 {
		t.Errorf("of %d attempts recorded to endpoints answering %d MiB of headers, %d failed with an error naming the headers "+
			"(%d answered %v; errors %q); %d deliveries marked delivered; want every attempt failed, naming the headers, and none delivered",
			out.attempts, floodHeaderBytes>>20, out.namingHeaders, out.answered, out.statuses, out.errors, out.delivered)
	}
	wrong := 0
	for _, e := range hooks {
		v := checkRequests(t, ctx, s.db, e)
		wrong += v.foreign + v.badSigs
	}
	var ledgers []ledger
	for i, tn := range tenants {
		ledgers = append(ledgers, ledger{s.merchants[i].ID, tn.ops})
	}
	money := auditMerchants(t, ctx, s.db, ledgers...)
	events := 0
	for _, tn := range tenants {
		events += len(tn.ops) + 1 // and the account's
	}
	t.Logf("%d events of 2 merchants to %d endpoints answering %d MiB of headers over 3 s: %d requests received (%d at once at most), "+
		"%d attempts recorded, %d naming the headers, %d answered %v, %d delivered; the service's memory idle %d MiB, "+
		"peak %d MiB (VmHWM), %d MiB the most read every 100 ms over %v; bound %d MiB",
		events, len(hooks), floodHeaderBytes>>20, len(flood.recv.all()), held, out.attempts, out.namingHeaders, out.answered, out.statuses,
		out.delivered, idle>>20, peak>>20, maxRSS>>20, window, (idle+memoryMargin)>>20)

	over := 0
	if peak > idle+memoryMargin {
		over = 1
	}
	summary{
		scenario: "webhooks: endpoints answering 9 MiB of headers",
		requests: tenants[0].c.stats.requests.Load() + tenants[1].c.stats.requests.Load(),
		faults: itoa(int64(len(hooks))) + " endpoints answering 204 after 9 MiB of headers, " + itoa(int64(events)) + " events; memory idle " +
			itoa(idle>>20) + " MiB, peak " + itoa(peak>>20) + " MiB (bound " + itoa((idle+memoryMargin)>>20) + " MiB); " +
			itoa(int64(out.attempts-out.namingHeaders)) + " of " + itoa(int64(out.attempts)) + " attempts not failed naming the headers",
		duplicates: money.duplicates,
		lost:       money.lost,
		violations: money.violations + over + out.attempts - out.namingHeaders + out.delivered + wrong,
		command:    reproduce("TestWebhookHugeHeadersMemoryBounded"),
	}.log(t, time.Since(s.began))
}

// errNoProcfs is memoryOf's answer where there is no /proc to read
// (proc_other_test.go).
var errNoProcfs = errors.New("no /proc/<pid>/status on this system")

// headerFlood is a merchant's web server gone wrong: it reads each delivery
// request, records it in recv as a hookReceiver would, then answers "204 No
// Content" preceded by size bytes of header lines, written in equal chunks
// over spread, and closes the connection. The test's cleanup ends the
// answers still being written.
type headerFlood struct {
	recv   hookReceiver // only its record of requests
	head   []byte       // the status line and the header lines
	spread time.Duration
	quit   chan struct{}
	wg     sync.WaitGroup

	mu            sync.Mutex
	inFlight, top int
}

// floodChunk is how much of its header a headerFlood writes at a time.
const floodChunk = 64 << 10

// newHeaderFlood returns a headerFlood answering size bytes of headers.
func newHeaderFlood(t *testing.T, size int, spread time.Duration) *headerFlood {
	t.Helper()
	line := "X-Pad: " + strings.Repeat("a", 1024-len("X-Pad: \r\n")) + "\r\n"
	// Connection: close, so that the client opens a connection per request
	// and no attempt fails on one this server closed.
	head := bytes.NewBufferString("HTTP/1.1 204 No Content\r\nConnection: close\r\n")
	for head.Len() < size {
		head.WriteString(line)
	}
	f := &headerFlood{head: head.Bytes(), spread: spread, quit: make(chan struct{})}
	t.Cleanup(func() { close(f.quit); f.wg.Wait() })
	return f
}

// listen serves f on addr until the test ends.
func (f *headerFlood) listen(t *testing.T, addr string) *httptest.Server {
	t.Helper()
	return serveOn(t, addr, f)
}

func (f *headerFlood) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	f.wg.Add(1)
	defer f.wg.Done()
	f.mu.Lock()
	f.inFlight++
	f.top = max(f.top, f.inFlight)
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.inFlight--; f.mu.Unlock() }()

	at := time.Now()
	body, _ := io.ReadAll(req.Body)
	f.recv.mu.Lock()
	if f.recv.got == nil {
		f.recv.got = map[string][]hookRequest{}
	}
	f.recv.got[req.URL.Path] = append(f.recv.got[req.URL.Path], hookRequest{
		eventID: req.Header.Get(webhook.EventIDHeader), signature: req.Header.Get(webhook.SignatureHeader),
		body: body, status: http.StatusNoContent, at: at,
	})
	f.recv.mu.Unlock()

	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	chunks := (len(f.head) + floodChunk - 1) / floodChunk
	pause := f.spread / time.Duration(chunks)
	for rest := f.head; len(rest) > 0; {
		n := min(floodChunk, len(rest))
		if _, err := conn.Write(rest[:n]); err != nil {
			return // the client gave up reading
		}
		rest = rest[n:]
		select {
		case <-f.quit:
			return
		case <-time.After(pause):
		}
	}
	_, _ = conn.Write([]byte("\r\n"))
}

// maxInFlight is the most requests f was answering at once.
func (f *headerFlood) maxInFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.top
}

// flood is what the record says of the attempts to the flooding endpoints,
// every endpoint of the scenario's.
type flood struct {
	attempts, namingHeaders, answered, delivered int
	statuses                                     []int
	errors                                       []string // the distinct errors recorded, a few
}

// floodOutcomes reads the attempts recorded and the deliveries delivered.
func floodOutcomes(t *testing.T, ctx context.Context, db *pgxpool.Pool) flood {
	t.Helper()
	var f flood
	must(t, db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE error ILIKE '%header%'), count(status),
	        coalesce(array_agg(DISTINCT status) FILTER (WHERE status IS NOT NULL), '{}'),
	        coalesce((array_agg(DISTINCT error) FILTER (WHERE error IS NOT NULL))[:3], '{}'),
	        (SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered')
	    FROM webhook_attempts`).Scan(&f.attempts, &f.namingHeaders, &f.answered, &f.statuses, &f.errors, &f.delivered),
		"count the attempts")
	return f
}
