package webhook

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// DefaultTimeout bounds a delivery: connecting, sending the event and reading
// the answer.
const DefaultTimeout = 10 * time.Second

// What a delivery reads of an answer: its status is all that counts, so an
// endpoint's answer holds little of a replica's memory however large it is.
// Headers over maxResponseHeader fail the attempt; of the body, up to
// maxResponseBody is read (so the connection serves the next delivery) and
// the rest is not.
const (
	maxResponseHeader = 16 << 10
	maxResponseBody   = 4 << 10
)

// NewClient returns the HTTP client that delivers webhooks. Every attempt
// must end within timeout (DefaultTimeout when it is 0 or less). It follows
// no redirect: a 3xx is the answer, and a failed attempt. It uses no proxy,
// whatever the environment says. Unless allowPrivate, it refuses to connect
// to any address that CheckURL refuses, checked on the address the dialer
// is about to use after DNS resolution, so a name that resolved to a public
// address when the endpoint was created and to a private one now (DNS
// rebinding) reaches nothing; the request's error then wraps ErrForbidden.
func NewClient(allowPrivate bool, timeout time.Duration) *http.Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = refuseForbidden
	}
	return &http.Client{
		// http.DefaultTransport's settings, without its proxy from the
		// environment, which would connect to what it likes.
		Transport: &http.Transport{
			DialContext:            dialer.DialContext,
			ForceAttemptHTTP2:      true,
			MaxIdleConns:           1024,
			MaxIdleConnsPerHost:    128, // an endpoint that keeps up has up to 128 in flight
			IdleConnTimeout:        90 * time.Second,
			MaxResponseHeaderBytes: maxResponseHeader,
			TLSHandshakeTimeout:    timeout,
			ExpectContinueTimeout:  time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       timeout,
	}
}

// refuseForbidden is a net.Dialer's Control: it runs with the resolved
// address, before the socket connects.
func refuseForbidden(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: dial %s %s: not an address and port", ErrForbidden, network, address)
	}
	if why := forbidden(ap.Addr()); why != "" {
		return fmt.Errorf("%w: dial %s: %s", ErrForbidden, ap.Addr().Unmap(), why)
	}
	return nil
}
