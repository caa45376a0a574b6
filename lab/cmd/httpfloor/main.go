// Command httpfloor measures what an HTTP request costs on this machine
// before any charge work: the CPU per request of a server that does nothing
// but answer, and of the client that asks (make http-floor).
//
// Issue 47 asks for a service CPU per charge of at most 0.08 ms. The service
// answers each charge with net/http, so net/http's own cost per request is
// a floor under that figure which no lean handler can go below. This
// measures it; beside it, what the best known replacement would cost
// (fasthttp, built for few allocations a request), and a lower floor: a
// bare HTTP/1.1 loop (read the
// request line and headers, read Content-Length bytes, write one fixed
// response), which is about what any server in Go pays the kernel and the
// runtime for a request and its answer on a loopback socket. That loop is a
// measuring stick, not a server to ship: it reads only what the load here
// sends.
//
// Each server runs as a child process (this binary, -serve), so /proc
// separates its CPU from the client's; the client is this process, shaped
// like the load generator (lab/cmd/paymentsbench: net/http keep-alive
// connections, one per client, a POST with a charge's body and headers, the
// response read whole). Each server is measured three ways:
//
//   - answering at once: saturated, the most requests per wake-up, the
//     cheapest a request gets;
//   - holding requests as the service holds charges: a request joins the
//     next group, a group is held for -wait (default 1 ms, about a charge
//     batch's round trip at 16 clients) while the next one gathers, and its
//     end wakes all its requests at once; this runs at about the service's
//     rate (4,000 to 5,000 requests a second) and pays its wake-ups;
//   - the same on a busy machine: a spinner at nice 19 on every CPU (this
//     binary, -spin), which takes only what the measured processes leave
//     and keeps the CPUs out of idle, as the service's 16-client load keeps
//     them about 80 % busy. An idle CPU's wake-ups cost more, so this is the
//     cell to read beside the service's figures.
//
// Rounds run every cell in turn; the table is their medians.
//
//	go -C lab run ./cmd/httpfloor [-clients 16] [-seconds 10] [-rounds 3] [-wait 1ms]
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// The request and the response are a fresh charge's, in size and headers.
var (
	chargeBody = []byte(`{"account_id":"0b0e9f3c-2f0c-4d2e-9a3e-1f1d2c3b4a59","amount":100,"currency":"USD","description":"bench"}`)
	chargeJSON = bytes.Repeat([]byte("x"), 420)
)

const (
	location  = "/v1/charges/0b0e9f3c-2f0c-4d2e-9a3e-1f1d2c3b4a59"
	requestID = "0b0e9f3c2f0c4d2e9a3e1f1d2c3b4a59"
)

func main() {
	fs := flag.NewFlagSet("httpfloor", flag.ExitOnError)
	serve := fs.String("serve", "", "run as the server: net/http, fasthttp or loop (the parent starts these)")
	spin := fs.Bool("spin", false, "run as a spinner: burn CPU at the lowest priority (the parent starts these)")
	wait := fs.Duration("wait", time.Millisecond, "how long a group of requests is held before its answers (a charge batch's round trip)")
	clients := fs.Int("clients", 16, "concurrent clients, one connection each")
	seconds := fs.Int("seconds", 10, "seconds measured per cell, after 2 s of warm-up")
	rounds := fs.Int("rounds", 3, "rounds; each runs every cell once")
	_ = fs.Parse(os.Args[1:])
	var err error
	switch {
	case *spin:
		err = runSpinner()
	case *serve != "":
		err = runServer(*serve, *wait)
	default:
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = measure(ctx, *clients, time.Duration(*seconds)*time.Second, *rounds, *wait)
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpfloor:", err)
		os.Exit(1)
	}
}

// runServer listens on a free loopback port, prints its address on stdout
// and serves until killed.
func runServer(kind string, wait time.Duration) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	switch kind {
	case "net/http":
		srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			hold(wait)
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set("Location", location)
			h.Set("Request-Id", requestID)
			h.Set("Content-Length", strconv.Itoa(len(chargeJSON)))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(chargeJSON)
		})}
		return srv.Serve(ln)
	case "fasthttp":
		contentLength := strconv.Itoa(len(chargeJSON))
		return fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) {
			_ = ctx.PostBody()
			hold(wait)
			ctx.SetStatusCode(http.StatusCreated)
			ctx.SetContentType("application/json")
			ctx.Response.Header.Set("Location", location)
			ctx.Response.Header.Set("Request-Id", requestID)
			ctx.Response.Header.Set("Content-Length", contentLength)
			ctx.SetBody(chargeJSON)
		})
	case "loop":
		response := fmt.Appendf(nil, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nLocation: %s\r\n"+
			"Request-Id: %s\r\nDate: Mon, 07 Dec 2026 00:00:00 GMT\r\nContent-Length: %d\r\n\r\n%s",
			location, requestID, len(chargeJSON), chargeJSON)
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			go answerLoop(c, response, wait)
		}
	}
	return fmt.Errorf("-serve %q: want net/http, fasthttp or loop", kind)
}

// answerLoop answers each request on c with response, until the client
// closes it or sends what it does not read (a body without Content-Length).
func answerLoop(c net.Conn, response []byte, wait time.Duration) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 4096)
	body := make([]byte, 0, 1024)
	for {
		n := -1
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if name, value, ok := bytes.Cut(line, []byte(":")); ok && strings.EqualFold(string(name), "Content-Length") {
				n, err = strconv.Atoi(string(bytes.TrimSpace(value)))
				if err != nil {
					return
				}
			}
		}
		if n < 0 || n > cap(body) {
			return
		}
		if _, err := io.ReadFull(r, body[:n]); err != nil {
			return
		}
		hold(wait)
		if _, err := c.Write(response); err != nil {
			return
		}
	}
}

// hold parks the request until a group it joined has taken wait: the
// service's charges wait so for their batch, one batch at a time, the next
// gathered while this one runs, and a batch's end wakes all its requests at
// once.
func hold(wait time.Duration) {
	if wait <= 0 {
		return
	}
	done := make(chan struct{})
	groups.mu.Lock()
	groups.next = append(groups.next, done)
	if !groups.running {
		groups.running = true
		go runGroups(wait)
	}
	groups.mu.Unlock()
	<-done
}

var groups struct {
	mu      sync.Mutex
	next    []chan struct{}
	running bool
}

// runGroups takes the requests gathered so far as one group, waits, wakes
// them, and goes on while requests keep coming.
func runGroups(wait time.Duration) {
	for {
		groups.mu.Lock()
		group := groups.next
		groups.next = nil
		if len(group) == 0 {
			groups.running = false
			groups.mu.Unlock()
			return
		}
		groups.mu.Unlock()
		time.Sleep(wait)
		for _, done := range group {
			close(done)
		}
	}
}

// runSpinner burns CPU at the lowest priority until killed: it takes only
// what the measured processes leave, and keeps the CPUs from idling.
func runSpinner() error {
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, 0, 19); err != nil {
		return fmt.Errorf("nice 19: %w", err)
	}
	for { //nolint:staticcheck // SA5002: spinning is its job
	}
}

// startSpinners starts one spinner a CPU and returns what stops them.
func startSpinners(ctx context.Context, self string) (func(), error) {
	var spinners []*exec.Cmd
	stop := func() {
		for _, cmd := range spinners {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	for range runtime.NumCPU() {
		cmd := exec.CommandContext(ctx, self, "-spin")
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			stop()
			return nil, err
		}
		spinners = append(spinners, cmd)
	}
	return stop, nil
}

// cell is one server answering after one wait, on a machine otherwise
// idle or kept busy.
type cell struct {
	server string
	wait   time.Duration
	busy   bool
}

func (c cell) String() string {
	machine := "idle"
	if c.busy {
		machine = "busy"
	}
	return fmt.Sprintf("%s, answers after %v, machine %s", c.server, c.wait, machine)
}

// result is one cell's run.
type result struct{ perSecond, serverMS, clientMS float64 }

func measure(ctx context.Context, clients int, d time.Duration, rounds int, wait time.Duration) error {
	var cells []cell
	for _, at := range []struct {
		wait time.Duration
		busy bool
	}{{0, false}, {wait, false}, {wait, true}} {
		for _, server := range []string{"net/http", "fasthttp", "loop"} {
			cells = append(cells, cell{server, at.wait, at.busy})
		}
	}
	runs := make(map[cell][]result)
	for round := 1; round <= rounds; round++ {
		for _, c := range cells {
			r, err := measureCell(ctx, c, clients, d)
			if err != nil {
				return fmt.Errorf("round %d, %v: %w", round, c, err)
			}
			fmt.Fprintf(os.Stderr, "round %d: %v: %.0f requests/s, server %.4f ms, client %.4f ms a request\n",
				round, c, r.perSecond, r.serverMS, r.clientMS)
			runs[c] = append(runs[c], r)
		}
	}
	fmt.Printf("%d clients, %v a cell, medians of %d rounds\n\n", clients, d, rounds)
	fmt.Println("| server | answers after | machine | requests/s | server CPU ms a request | client CPU ms a request |")
	fmt.Println("|---|---:|---|---:|---:|---:|")
	for _, c := range cells {
		var perSecond, server, client []float64
		for _, r := range runs[c] {
			perSecond, server, client = append(perSecond, r.perSecond), append(server, r.serverMS), append(client, r.clientMS)
		}
		machine := "idle"
		if c.busy {
			machine = "busy"
		}
		fmt.Printf("| %s | %v | %s | %.0f | %.4f | %.4f |\n", c.server, c.wait, machine, med(perSecond), med(server), med(client))
	}
	return nil
}

// measureCell starts the cell's server, loads it for 2 s, then measures for
// d: requests answered and the CPU both processes spent.
func measureCell(ctx context.Context, c cell, clients int, d time.Duration) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	cmd := exec.CommandContext(ctx, self, "-serve", c.server, "-wait", c.wait.String()) //nolint:gosec // G204: this binary, as a server
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return result{}, fmt.Errorf("the server printed no address: %w", err)
	}
	url := "http://" + strings.TrimSpace(addr) + "/v1/charges"
	if c.busy {
		stopSpinners, err := startSpinners(ctx, self)
		if err != nil {
			return result{}, err
		}
		defer stopSpinners()
	}

	tr := &http.Transport{MaxIdleConns: 2 * clients, MaxIdleConnsPerHost: 2 * clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var answered atomic.Int64
	var failed atomic.Value
	loadCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for n := 0; loadCtx.Err() == nil; n++ {
				if err := ask(loadCtx, hc, url, fmt.Sprintf("floor-%d-%d", i, n)); err != nil {
					if loadCtx.Err() == nil {
						failed.Store(err)
						stop()
					}
					return
				}
				answered.Add(1)
			}
		})
	}
	benchrun.Sleep(loadCtx, 2*time.Second)
	server0, client0, n0, t0 := cpuTicks(cmd.Process.Pid), cpuTicks(os.Getpid()), answered.Load(), time.Now()
	benchrun.Sleep(loadCtx, d)
	server1, client1, n1, elapsed := cpuTicks(cmd.Process.Pid), cpuTicks(os.Getpid()), answered.Load(), time.Since(t0)
	stop()
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return result{}, err
	}
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	requests := float64(n1 - n0)
	if requests == 0 {
		return result{}, errors.New("no request answered")
	}
	msPerTick := 1000 / float64(clockTicks)
	return result{
		perSecond: requests / elapsed.Seconds(),
		serverMS:  float64(server1-server0) * msPerTick / requests,
		clientMS:  float64(client1-client0) * msPerTick / requests,
	}, nil
}

// ask sends one charge-shaped POST and reads the answer whole.
func ask(ctx context.Context, hc *http.Client, url, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(chargeBody))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_0123456789abcdefghijklmnopqrstuv")
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusCreated || n != int64(len(chargeJSON)):
		return fmt.Errorf("answered %d with %d bytes, want 201 with %d", resp.StatusCode, n, len(chargeJSON))
	}
	return nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's CPU
// times: 100 on every Linux this runs on.
const clockTicks = 100

// cpuTicks is the CPU time process pid has used, in clock ticks; 0 if
// /proc cannot say, which makes the cell's figures 0, not an error.
func cpuTicks(pid int) int64 {
	n, _ := benchrun.ProcessCPUTicks(pid)
	return n
}

func med(xs []float64) float64 {
	m, _ := benchrun.Median(xs)
	return m
}
