package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// hookReceiver is bench-pair's webhook endpoint (PAIR_WEBHOOK): an HTTP
// server on a loopback port that answers 204 at once and notes, for each
// event the first time it arrives, its delay from the event's created_at
// (the start of the transaction that wrote it, as PAIR_EVENTS times the
// relay's events). It runs in benchrun: its CPU is the machine's, not the
// service's.
type hookReceiver struct {
	srv  *http.Server
	addr string

	mu     sync.Mutex
	delays map[string]time.Duration // by event id
}

// startHookReceiver listens on a loopback port and serves.
func startHookReceiver() (*hookReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hookReceiver{addr: ln.Addr().String(), delays: map[string]time.Duration{}}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = h.srv.Serve(ln) }()
	return h, nil
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	var e struct {
		CreatedAt time.Time `json:"created_at"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || json.Unmarshal(body, &e) != nil {
		http.Error(w, "not an event", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	if id := r.Header.Get("Payments-Event-Id"); h.delays[id] == 0 {
		h.delays[id] = max(at.Sub(e.CreatedAt), time.Nanosecond)
	}
	h.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// close stops the server.
func (h *hookReceiver) close() { _ = h.srv.Close() }

func (h *hookReceiver) received() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.delays)
}

// subscribe records an endpoint of the merchant whose key is apiKey, at the
// receiver, for charge.succeeded, through the service's API.
func (h *hookReceiver) subscribe(ctx context.Context, svcURL, apiKey string) error {
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	body := `{"url":"http://` + h.addr + `/hook","events":["charge.succeeded"]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, svcURL+"/v1/webhook_endpoints", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", hex.EncodeToString(key))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("create the webhook endpoint: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		answer, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		return fmt.Errorf("create the webhook endpoint: %d %s", res.StatusCode, bytes.TrimSpace(answer))
	}
	return nil
}

// hookResult is what one measurement's deliveries did.
type hookResult struct {
	Events    int     // charge.succeeded events written
	PerS      float64 // of them, arrived during the load, per second of it
	DrainS    float64 // seconds after the load until the last arrived
	P50, P99  float64 // ms from the event's transaction's start to its arrival
	Delivered int     // events arrived by the end of settle
}

// settle, called when the load (of seconds) has ended, waits until every
// charge.succeeded event of database has arrived (3 minutes at most) and
// says what the deliveries did.
func (h *hookReceiver) settle(ctx context.Context, database string, seconds int) (hookResult, error) {
	ended := time.Now()
	during := h.received()
	n, err := benchrun.Value(ctx, database, `SELECT count(*)::text FROM events WHERE type = 'charge.succeeded'`)
	if err != nil {
		return hookResult{}, err
	}
	r := hookResult{PerS: float64(during) / float64(seconds)}
	r.Events, _ = strconv.Atoi(n)
	for h.received() < r.Events && time.Since(ended) < 3*time.Minute && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	r.DrainS = time.Since(ended).Seconds()
	h.mu.Lock()
	delays := make([]float64, 0, len(h.delays))
	for _, d := range h.delays {
		delays = append(delays, float64(d.Microseconds())/1000)
	}
	h.mu.Unlock()
	r.Delivered = len(delays)
	if r.Delivered < r.Events {
		return r, fmt.Errorf("webhooks: %d of %d charge.succeeded events delivered 3 minutes after the load", r.Delivered, r.Events)
	}
	slices.Sort(delays)
	if len(delays) > 0 {
		r.P50, r.P99 = delays[len(delays)/2], delays[len(delays)*99/100]
	}
	return r, nil
}

// settleHooks waits for the measurement's deliveries, appends their figures
// to the side's file and prints them.
func (p *pair) settleHooks(ctx context.Context, hooks *hookReceiver, database, side, relay string, round int) error {
	r, err := hooks.settle(ctx, database, p.seconds)
	if err != nil {
		return fmt.Errorf("%s relay %s round %d: %w", side, relay, round, err)
	}
	fmt.Fprintf(p.stderr, "%s relay %s round %d: webhooks: %d events, %.0f/s delivered during the load, the rest within %.1f s after it; delay p50 %.1f ms, p99 %.1f ms\n",
		side, relay, round, r.Events, r.PerS, r.DrainS, r.P50, r.P99)
	return appendLine(p.hookPath(side, relay), r.line())
}

// line is the measurement's webhook figures, for the file.
func (r hookResult) line() string {
	return fmt.Sprintf("%d %.0f %.1f %.1f %.1f", r.Events, r.PerS, r.DrainS, r.P50, r.P99)
}

// hookTable is the table of the webhook sides' figures, medians over the
// rounds of the lines in each side's file.
func (p *pair) hookTable() (string, error) {
	var b strings.Builder
	b.WriteString("\nWebhooks (PAIR_WEBHOOK): one endpoint of the merchant subscribed to charge.succeeded, on a loopback receiver in benchrun\n\n" +
		"| side | relay | events | delivered/s during the load | drained s after it | delay p50 ms | delay p99 ms |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, side := range p.sides {
		if !p.webhookSide(side.name) {
			continue
		}
		for _, relay := range p.relays {
			data, err := os.ReadFile(p.hookPath(side.name, relay))
			if err != nil {
				return "", err
			}
			cols := make([][]string, 5)
			for line := range strings.Lines(string(data)) {
				for i, f := range strings.Fields(line) {
					if i < len(cols) {
						cols[i] = append(cols[i], f)
					}
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", side.name, relay,
				textMedian(cols[0]), textMedian(cols[1]), textMedian(cols[2]), textMedian(cols[3]), textMedian(cols[4]))
		}
	}
	return b.String(), nil
}

// hookPath is the file of one side's webhook figures with the relay on or off.
func (p *pair) hookPath(side, relay string) string {
	return p.resultsPath(side, relay) + ".webhooks"
}

// webhookSide says whether PAIR_WEBHOOK names the side.
func (p *pair) webhookSide(name string) bool { return slices.Contains(p.webhooks, name) }
