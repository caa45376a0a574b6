package chaos_test

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// simProxy is a TCP proxy between the service and the card processor
// simulator. The service's PROCESSOR_URL names it, so that its address stays
// the same across the simulator's restarts (each takes a new port); while
// the simulator is down the proxy's listener is closed too, so a call is
// refused as a dead processor refuses it (nothing sent), not accepted and
// dropped. It reads just enough HTTP/1.1 (one request at a time on a
// connection, no pipelining) to tell whether a call waits for its answer,
// and counts what the service got: answers that never came, 500s, answers
// slower than slow (but those of pm_card_slow, slow on purpose).
type simProxy struct {
	t    *testing.T
	addr string
	slow time.Duration

	calls    atomic.Int64 // requests the service sent
	dropped  atomic.Int64 // requests whose connection the processor side closed before any answer
	errors   atomic.Int64 // answers 500
	slowed   atomic.Int64 // answers that began after slow or later
	given    atomic.Int64 // requests whose caller closed the connection before any answer (a kill, a timeout)
	refusals atomic.Int64 // connections refused while the simulator was down (or could not be dialled)

	mu     sync.Mutex
	ln     net.Listener // nil while down
	target string
	conns  map[*proxiedCall]struct{}
	wg     sync.WaitGroup
}

// proxiedCall is one connection through the proxy, and whether a request on
// it waits for its answer.
type proxiedCall struct {
	down, up net.Conn // the service's side, the simulator's

	mu      sync.Mutex
	waiting bool      // a request went up since the last answer began
	sent    time.Time // when it did
	slowPM  bool      // the request charges pm_card_slow, slow on purpose
}

// newSimProxy reserves an address for the proxy; it listens once up names
// the simulator. The test's cleanup closes it and every connection.
func newSimProxy(t *testing.T, slow time.Duration) *simProxy {
	t.Helper()
	p := &simProxy{t: t, addr: freeAddr(t), slow: slow, conns: map[*proxiedCall]struct{}{}}
	t.Cleanup(p.close)
	return p
}

// url is the base URL the service calls the processor at.
func (p *simProxy) url() string { return "http://" + p.addr }

// up starts listening again and forwards every connection to target, the
// simulator's base URL ("http://host:port").
func (p *simProxy) up(target string) error {
	ln, err := listenRetrying(p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln, p.target = ln, target[len("http://"):]
	p.mu.Unlock()
	acceptEach(ln, &p.wg, p.relay) // until down or close closes ln
	return nil
}

// listenRetrying listens on addr, trying again for a second while the
// address is still taken (a connection of the last listener in TIME_WAIT
// does not take it, but the kernel may be slow to let it go).
func listenRetrying(addr string) (net.Listener, error) {
	var err error
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			return ln, err
		}
	}
}

// down stops listening: new calls are refused. Connections already open
// end when the simulator's side ends (the simulator is being killed).
func (p *simProxy) down() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// close stops listening, cuts every connection and waits for the relays.
func (p *simProxy) close() {
	p.down()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.down.Close()
		if c.up != nil {
			_ = c.up.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// inFlight is how many calls wait for their answer now.
func (p *simProxy) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		c.mu.Lock()
		if c.waiting {
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// relay carries one connection of the service's to the simulator and back.
func (p *simProxy) relay(down net.Conn) {
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	up, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		p.refusals.Add(1)
		_ = down.Close() // the simulator died between accept and dial
		return
	}
	c := &proxiedCall{down: down, up: up}
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.requests(c)
	}()
	p.answers(c)
	<-done
}

// requests copies the service's requests up; the service closing its side
// ends the connection, a call still waiting then given up.
func (p *simProxy) requests(c *proxiedCall) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.down.Read(buf)
		if n > 0 {
			c.mu.Lock()
			if !c.waiting {
				c.waiting, c.sent, c.slowPM = true, time.Now(), false
				p.calls.Add(1)
			}
			c.slowPM = c.slowPM || bytes.Contains(buf[:n], []byte(`"pm_card_slow"`))
			c.mu.Unlock()
			if _, werr := c.up.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			c.mu.Lock()
			if c.waiting && !errors.Is(err, net.ErrClosed) {
				p.given.Add(1)
				c.waiting = false
			}
			c.mu.Unlock()
			_ = c.up.Close()
			_ = c.down.Close()
			return
		}
	}
}

// answers copies the simulator's answers down, noting the start of each;
// the simulator closing its side with a request waiting drops its answer.
func (p *simProxy) answers(c *proxiedCall) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.up.Read(buf)
		if n > 0 {
			c.mu.Lock()
			if c.waiting {
				c.waiting = false
				if time.Since(c.sent) >= p.slow && !c.slowPM {
					p.slowed.Add(1)
				}
				if bytes.HasPrefix(buf[:n], []byte("HTTP/1.1 500 ")) {
					p.errors.Add(1)
				}
			}
			c.mu.Unlock()
			if _, werr := c.down.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			c.mu.Lock()
			if c.waiting {
				p.dropped.Add(1)
				c.waiting = false
			}
			c.mu.Unlock()
			_ = c.down.Close()
			_ = c.up.Close()
			return
		}
	}
}
