package httpapi

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// TestClientOf: the budget's client is the peer, unless the peer is a
// trusted proxy: then the rightmost X-Forwarded-For address that is not a
// trusted proxy. What a client writes itself, to the left, never counts; a
// header from a peer not trusted, or without a usable address, is ignored.
// IPv6 clients count by their /64.
func TestClientOf(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"no proxy", "192.0.2.7:5100", nil, "192.0.2.7"},
		{"untrusted peer's header ignored", "192.0.2.7:5100", []string{"198.51.100.1"}, "192.0.2.7"},
		{"trusted peer", "10.0.0.2:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"client's own entry on the left", "10.0.0.2:80", []string{"6.6.6.6, 198.51.100.1"}, "198.51.100.1"},
		{"a chain of trusted proxies", "10.0.0.2:80", []string{"6.6.6.6, 198.51.100.1, 10.1.1.1, 10.2.2.2"}, "198.51.100.1"},
		{"several headers, in order", "10.0.0.2:80", []string{"6.6.6.6", "198.51.100.1, 10.1.1.1"}, "198.51.100.1"},
		{"entries with ports", "10.0.0.2:80", []string{"198.51.100.1:5100, [2001:db8:ffff::1]:443"}, "198.51.100.1"},
		{"trusted peer, no header", "10.0.0.2:80", nil, "10.0.0.2"},
		{"trusted peer, garbage on the right", "10.0.0.2:80", []string{"198.51.100.1, unknown"}, "10.0.0.2"},
		{"garbage left of the client", "10.0.0.2:80", []string{"garbage, 198.51.100.1"}, "198.51.100.1"},
		{"every entry a trusted proxy", "10.0.0.2:80", []string{"10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"IPv6 client by its /64", "[2001:db8:ffff::2]:80", []string{"2001:db8:1:2:3:4:5:6"}, "2001:db8:1:2::/64"},
		{"IPv4-mapped peer", "[::ffff:10.0.0.2]:80", []string{"198.51.100.1"}, "198.51.100.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(nil, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{TrustedProxies: trusted})
			r := httptest.NewRequest("GET", "/v1/charges", nil)
			r.RemoteAddr = tc.peer
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := s.clientOf(r); got != tc.want {
				t.Errorf("clientOf = %q, want %q", got, tc.want)
			}
		})
	}
}
