package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
)

// drain is serve's way out of traffic. From the first SIGTERM (or SIGINT) on,
// /readyz answers 503 and every response asks its client to close the
// connection, while the listener goes on serving everything for
// SHUTDOWN_DELAY: a load balancer or Kubernetes needs that long to notice
// and stop sending. Only then does the server close the listener and drain
// what is in flight, for up to SHUTDOWN_TIMEOUT.
type drain struct {
	delay, timeout time.Duration
	started        atomic.Bool
}

// errShuttingDown is /readyz's answer once the drain has started.
var errShuttingDown = fmt.Errorf("%w: asked to stop (SIGTERM); this replica serves on only until its load balancer has moved traffic away (SHUTDOWN_DELAY)",
	payment.ErrShuttingDown)

// ready returns errShuttingDown once the drain has started.
func (d *drain) ready() error {
	if d.started.Load() {
		return errShuttingDown
	}
	return nil
}

// closeWhileDraining adds Connection: close to every response once the drain
// has started: net/http then closes the connection after the response, and
// the client's next request opens a new one, which its load balancer sends
// to a replica that is not going away.
func (d *drain) closeWhileDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.started.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// wait waits out the delay, or less if a second signal asks to hurry
// (hurryFrom). It reports whether it was cut short.
func (d *drain) wait(ctx context.Context) (hurried bool) {
	if d.delay <= 0 {
		return false
	}
	t := time.NewTimer(d.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-hurryFrom(ctx):
		return true
	}
}

type hurryKey struct{}

type signalKey struct{}

// stopSignal names the signal that ended ctx (shutdownSignals), or says
// that none did (the command ended by itself, or ctx was not a signal's).
func stopSignal(ctx context.Context) string {
	if v, ok := ctx.Value(signalKey{}).(*atomic.Value); ok {
		if s, ok := v.Load().(string); ok {
			return s
		}
	}
	return "none"
}

// withHurry returns ctx carrying hurry, which closes when the process is
// asked a second time to stop: the drain then skips what is left of
// SHUTDOWN_DELAY (in-flight requests still get SHUTDOWN_TIMEOUT).
func withHurry(ctx context.Context, hurry <-chan struct{}) context.Context {
	return context.WithValue(ctx, hurryKey{}, hurry)
}

// hurryFrom returns the channel withHurry put in ctx, or nil (which never
// fires).
func hurryFrom(ctx context.Context) <-chan struct{} {
	hurry, _ := ctx.Value(hurryKey{}).(<-chan struct{})
	return hurry
}

// shutdownSignals returns a context that ends at the first SIGINT or
// SIGTERM; a second one closes its hurry channel (withHurry). stop releases
// the signals.
func shutdownSignals(parent context.Context) (ctx context.Context, stop func()) {
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	ctx, release := shutdownOn(parent, signals)
	return ctx, func() {
		signal.Stop(signals)
		release()
	}
}

// shutdownOn is shutdownSignals on the signals that come on signals.
func shutdownOn(parent context.Context, signals <-chan os.Signal) (ctx context.Context, stop func()) {
	hurry := make(chan struct{})
	received := new(atomic.Value)
	ctx, cancel := context.WithCancel(context.WithValue(withHurry(parent, hurry), signalKey{}, received))
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-signals:
			received.Store(sig.String())
			cancel()
		case <-done:
			return
		}
		select {
		case <-signals:
			close(hurry)
		case <-done:
		}
	}()
	return ctx, func() {
		close(done)
		cancel()
	}
}
