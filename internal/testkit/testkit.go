// Package testkit holds what the tests of several packages need: a log
// buffer safe for concurrent writers, an embedded NATS server with JetStream,
// a balance read straight from the table, the store with the charge path in
// front of it as cmd/payments wires them (service.go), the whole API in
// process with a merchant of its own (api.go), and a switch that cuts a test
// database off, with a reader of JSON logs, for outage tests (outage.go).
// Only tests import it.
package testkit

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/exactlyonce/payments/internal/payment"
)

// LogBuffer collects output written from several goroutines (a service's
// log, a command's output).
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail returns the last n bytes, for failure messages.
func (b *LogBuffer) Tail(n int) string {
	s := b.String()
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Lines counts the lines written so far.
func (b *LogBuffer) Lines() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Count(b.buf.Bytes(), []byte("\n"))
}

// NATS is an embedded NATS server with JetStream on loopback, which a test
// can stop and start again on the same port and storage, as an outage would.
// The test's cleanup stops it.
type NATS struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

// StartNATS starts a server for the test.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	n := &NATS{t: t, opts: server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	}}
	n.Start()
	t.Cleanup(n.Stop)
	return n
}

// URL is the server's client URL.
func (n *NATS) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.opts.Port) }

// Start starts the server again after Stop.
func (n *NATS) Start() {
	n.t.Helper()
	opts := n.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		n.t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("NATS did not start")
	}
	n.srv = srv
}

// Stop shuts the server down; its stream storage stays for Start.
func (n *NATS) Stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// Connect opens a client that keeps reconnecting through outages; the test's
// cleanup closes it.
func (n *NATS) Connect() *nats.Conn {
	n.t.Helper()
	nc, err := nats.Connect(n.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(nc.Close)
	return nc
}

// Querier is what a pool, a connection and a transaction offer.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Balance reads an account's balance (an acct_ id) straight from the table.
func Balance(ctx context.Context, t testing.TB, db Querier, merchantID uuid.UUID, accountID string) int64 {
	t.Helper()
	id, ok := payment.ParseID(payment.PrefixAccount, accountID)
	if !ok {
		t.Fatalf("bad account id %q", accountID)
	}
	var b int64
	if err := db.QueryRow(ctx, `SELECT balance FROM accounts WHERE merchant_id = $1 AND id = $2`, merchantID, id).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}
