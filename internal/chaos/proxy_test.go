package chaos_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// pgProxy is a fault-injecting TCP proxy between the service and PostgreSQL.
// It understands just enough of the wire protocol to find the commit point of
// every unit of work that claims an idempotency key: the COMMIT of an explicit
// transaction (pgx's tx.Commit sends the simple query "commit"; a keyed write
// pipelines BEGIN with its claim and COMMIT with its last statements), or the Sync
// after a claim that runs without BEGIN (a charge batch decided ahead, an
// implicit transaction that commits there). At that point it can lose the
// acknowledgement of a commit the server performed, or lose the commit
// itself. And it can cut the database off entirely, dropping every connection
// and refusing new ones, then restore it.
type pgProxy struct {
	t                  *testing.T
	upNetwork, upAddr  string
	addr               string
	fault              atomic.Int32 // a fault, armed for the next commit point
	fired              chan fault   // each armed fault once it happened
	commits, acksLost  atomic.Int64 // commit points seen; acknowledgements lost
	commitsLost, conns atomic.Int64 // commits lost; connections carried
	atSync             atomic.Int64 // faults at the Sync of a one-statement claim or a pipelined COMMIT
	passedOver         atomic.Int64 // units of work a lost acknowledgement waited past: they failed, committing nothing

	mu     sync.Mutex
	ln     net.Listener // nil while cut
	open   map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// fault is what the proxy does to the next COMMIT.
type fault int32

const (
	noFault fault = iota
	// loseAck forwards the COMMIT (or Sync), lets the server commit and
	// answer, and drops the connection before the answer reaches the client.
	// A unit of work that did not commit (the server answered it with an
	// error: a charge batch decided ahead that the database refused, say)
	// has no acknowledgement of a commit to lose: its answer is passed on
	// and the fault stays armed for the next commit point.
	loseAck
	// loseCommit drops the connection instead of forwarding the COMMIT (or
	// Sync): the server rolls the transaction back.
	loseCommit
)

func (f fault) String() string {
	return [...]string{"none", "lost acknowledgement", "lost commit"}[f]
}

// newProxy starts a proxy in front of the database databaseURL names and
// returns it with the URL that reaches the database through it.
func newProxy(t *testing.T, databaseURL string) (*pgProxy, string) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(databaseURL)
	must(t, err, "parse database URL")
	p := &pgProxy{t: t, fired: make(chan fault, 16), open: map[net.Conn]struct{}{}}
	if strings.HasPrefix(cfg.Host, "/") {
		p.upNetwork, p.upAddr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	} else {
		p.upNetwork, p.upAddr = "tcp", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err, "proxy listen")
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.close)

	u, err := url.Parse(databaseURL)
	must(t, err, "parse database URL")
	u.Host = p.addr
	q := u.Query()
	q.Set("sslmode", "disable") // the proxy reads the protocol, so no TLS
	q.Del("host")
	u.RawQuery = q.Encode()
	return p, u.String()
}

func (p *pgProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	acceptEach(ln, &p.wg, p.relay) // until cut or close closes ln
}

// arm makes the proxy inject f at the next commit point of a key claim on
// any connection.
func (p *pgProxy) arm(f fault) { p.fault.Store(int32(f)) }

// waitFired waits up to 10 s for an armed fault to happen.
func (p *pgProxy) waitFired() (fault, bool) {
	select {
	case f := <-p.fired:
		return f, true
	case <-time.After(10 * time.Second):
		return noFault, false
	}
}

// cut drops every connection and refuses new ones until restore.
func (p *pgProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.open {
		c.Close()
	}
}

// restore accepts connections again, on the same address.
func (p *pgProxy) restore() error {
	var ln net.Listener
	var err error
	for range 50 { // the port may take a moment to be free again
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serve(ln)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("proxy: listen on %s again: %w", p.addr, err)
}

// close stops the proxy and waits for its goroutines.
func (p *pgProxy) close() {
	p.cut()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers a connection so cut can drop it; it reports false (and
// closes it) when the proxy is cut or closed meanwhile.
func (p *pgProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil || p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.open[c] = struct{}{}
	}
	return true
}

func (p *pgProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.open, c)
	}
}

// relay carries one client connection to the server and back, watching
// for the commit point of a unit of work that claims an idempotency key: the
// COMMIT of a transaction in which the claim ran, or the Sync that ends a
// claim run as a statement of its own (an implicit transaction, which commits
// at that Sync). There an armed fault strikes.
func (p *pgProxy) relay(client net.Conn) {
	server, err := net.DialTimeout(p.upNetwork, p.upAddr, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	defer p.untrack(client, server)
	p.conns.Add(1)

	// Server to client, message by message, noting the transaction status
	// each ReadyForQuery reports. Once swallowing, nothing more reaches the
	// client, and at the next ReadyForQuery the server has finished the unit
	// of work: answered says whether it committed. One that failed (an
	// ErrorResponse among what was swallowed) committed nothing: what was
	// held back goes to the client after all, and relaying goes on.
	var (
		txStatus atomic.Int32 // 'I' idle, 'T' in a transaction, 'E' failed one
		swallow  atomic.Bool
		answered = make(chan bool, 1)
		down     = make(chan struct{})
	)
	txStatus.Store('I')
	go func() {
		defer close(down)
		defer client.Close()
		r := bufio.NewReader(server)
		var (
			held   []byte // swallowed, in case the unit did not commit
			failed bool   // an ErrorResponse among them
		)
		for {
			msg, err := readMessage(r, true)
			if err != nil {
				return
			}
			if msg[0] == 'Z' && len(msg) > 5 {
				txStatus.Store(int32(msg[5]))
			}
			if swallow.Load() {
				held, failed = append(held, msg...), failed || msg[0] == 'E'
				if msg[0] != 'Z' {
					continue
				}
				verdict := !failed
				if failed {
					swallow.Store(false)
					msg, held, failed = held, nil, false
				}
				select {
				case answered <- verdict:
				default: // a verdict nobody took yet: the connection is ending
				}
				if verdict {
					continue
				}
			}
			if _, err := client.Write(msg); err != nil {
				return
			}
		}
	}()
	defer func() { server.Close(); <-down }()

	// Client to server. Startup first: the proxy itself declines SSL and GSS
	// encryption (it must read the protocol), then forwards the startup
	// message.
	r := bufio.NewReader(client)
	for {
		msg, err := readMessage(r, false)
		if err != nil {
			return
		}
		if code := binary.BigEndian.Uint32(msg[4:8]); code == 80877103 || code == 80877104 {
			if _, err := client.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		if _, err := server.Write(msg); err != nil {
			return
		}
		break
	}

	var (
		statements  = map[string]bool{} // prepared statement name → it claims a key
		commits     = map[string]bool{} // prepared statement name → it is COMMIT
		begins      = map[string]bool{} // prepared statement name → it is BEGIN
		rollbacks   = map[string]bool{} // prepared statement name → it is ROLLBACK
		begunHere   bool                // a BEGIN is pipelined before the Sync (a keyed write's, with its claim)
		claimedInTx bool                // a claim ran in the open transaction
		claimBatch  bool                // a claim runs as its own transaction, until the Sync
		pipelined   bool                // a COMMIT is pipelined before the Sync; pending strikes there
		pending     fault               // the fault striking at that Sync
		forward     = func(msg []byte) bool {
			_, err := server.Write(msg)
			return err == nil
		}
	)
	// strike carries out f at a commit point, commit the message that
	// commits (already forwarded when nil). It reports whether it ended the
	// connection: it does not when the unit of work failed instead of
	// committing, and then f stays armed for the next commit point.
	strike := func(f fault, commit []byte) (ended bool) {
		switch f {
		case loseAck:
			if commit != nil && !forward(commit) {
				return true
			}
			// Only once the server has committed and answered does the
			// client see its connection end, without the answer. (Were it
			// to end earlier, pgx would send a CancelRequest for the
			// statement still running, and the server would roll back: a
			// lost commit, not a lost acknowledgement.)
			select {
			case committed := <-answered:
				if !committed {
					p.commits.Add(-1)
					p.passedOver.Add(1)
					p.fault.Store(int32(loseAck))
					return false
				}
			case <-time.After(5 * time.Second):
			}
			p.acksLost.Add(1)
		case loseCommit:
			p.commitsLost.Add(1) // never forwarded: the server rolls back
		}
		p.fired <- f
		return true
	}
	for {
		msg, err := readMessage(r, true)
		if err != nil {
			return
		}
		switch msg[0] {
		case 'P': // Parse: name, query, ...
			name, rest, _ := bytes.Cut(msg[5:], []byte{0})
			query, _, _ := bytes.Cut(rest, []byte{0})
			statements[string(name)] = claimsKey.Match(query)
			commits[string(name)] = isCommit(query)
			begins[string(name)] = isBegin(query)
			rollbacks[string(name)] = isRollback(query)
		case 'B': // Bind: portal, statement, ...
			_, rest, _ := bytes.Cut(msg[5:], []byte{0})
			name, _, _ := bytes.Cut(rest, []byte{0})
			switch {
			case begins[string(name)]:
				// BEGIN pipelined with what follows it (a keyed write's
				// claim): the transaction is open from here, whatever the
				// last ReadyForQuery said.
				begunHere = true
			case rollbacks[string(name)]:
				claimedInTx = false
			}
			if commits[string(name)] && claimedInTx {
				// A COMMIT pipelined after the claim (the group commit's
				// batch): the server commits as it executes it, and answers
				// by the Sync that ends the pipeline.
				claimedInTx = false
				p.commits.Add(1)
				if f := fault(p.fault.Swap(int32(noFault))); f != noFault {
					if f == loseCommit {
						strike(f, nil)
						return
					}
					swallow.Store(true)
					pipelined, pending = true, f
				}
				break
			}
			if statements[string(name)] {
				if txStatus.Load() != 'I' || begunHere {
					claimedInTx = true
				} else {
					// A claim as its own implicit transaction: it commits
					// at the Sync that ends this batch.
					claimBatch = true
					if f := fault(p.fault.Swap(int32(noFault))); f != noFault {
						pending = f
						swallow.Store(f == loseAck)
					}
				}
			}
		case 'S': // Sync
			begunHere = false
			if pipelined || (claimBatch && pending != noFault) {
				if claimBatch {
					p.commits.Add(1)
				}
				f := pending
				pipelined, claimBatch, pending = false, false, noFault
				p.atSync.Add(1)
				if strike(f, msg) {
					return
				}
				p.atSync.Add(-1)
				continue // the Sync went with the strike
			}
			if claimBatch {
				claimBatch = false
				p.commits.Add(1)
			}
		case 'Q': // a simple query: pgx's BEGIN, COMMIT and ROLLBACK
			query := msg[5:]
			if isCommit(query) {
				if claimedInTx {
					claimedInTx = false
					p.commits.Add(1)
					if f := fault(p.fault.Swap(int32(noFault))); f != noFault {
						swallow.Store(f == loseAck)
						if strike(f, msg) {
							return
						}
						continue // the COMMIT went with the strike
					}
				}
			} else if isRollback(query) {
				claimedInTx = false
			}
		}
		if !forward(msg) {
			return
		}
	}
}

// acceptEach relays every connection ln accepts, each on a goroutine of its
// own counted by wg, until ln is closed.
func acceptEach(ln net.Listener, wg *sync.WaitGroup, relay func(net.Conn)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				relay(c)
			}()
		}
	}()
}

// claimsKey matches SQL that claims an idempotency key.
var claimsKey = regexp.MustCompile(`(?is)\binsert\s+into\s+idempotency_keys\b`)

// readMessage reads one protocol message: a type byte (if typed), a length
// that counts itself, and the payload. It returns the raw bytes.
func readMessage(r *bufio.Reader, typed bool) ([]byte, error) {
	head := 4
	if typed {
		head = 5
	}
	msg := make([]byte, head, 256)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4 : head]))
	if n < 4 || n > 1<<30 {
		return nil, errors.New("proxy: bad message length")
	}
	msg = append(msg, make([]byte, n-4)...)
	if _, err := io.ReadFull(r, msg[head:]); err != nil {
		return nil, err
	}
	if !typed && len(msg) < 8 {
		return nil, errors.New("proxy: short startup message")
	}
	return msg, nil
}

// isCommit reports whether a simple query's text is COMMIT (or END).
func isCommit(query []byte) bool {
	q := simpleQuery(query)
	return strings.EqualFold(q, "commit") || strings.EqualFold(q, "end")
}

// isBegin reports whether a query's text is BEGIN.
func isBegin(query []byte) bool {
	q := simpleQuery(query)
	return strings.EqualFold(q, "begin") || strings.EqualFold(q, "start transaction")
}

// isRollback reports whether a simple query's text is ROLLBACK.
func isRollback(query []byte) bool {
	return strings.EqualFold(simpleQuery(query), "rollback")
}

func simpleQuery(query []byte) string {
	q := strings.TrimSpace(strings.TrimRight(string(query), "\x00"))
	return strings.TrimSpace(strings.TrimSuffix(q, ";"))
}
