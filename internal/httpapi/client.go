package httpapi

import (
	"net/http"
	"net/netip"
	"strings"
)

// clientOf names the client by its address, for the budget of unknown API
// keys: an IPv6 client by its /64, which one host usually holds whole. The
// address is the peer's, unless the peer is one of Options.TrustedProxies:
// then it is the rightmost address of X-Forwarded-For that is not itself a
// trusted proxy (each proxy appends the address it got the request from, so
// what a client writes there itself is to the left of it). A header from a
// peer not trusted is ignored, as is one without a usable address: the
// client is then the peer.
func (s *Server) clientOf(r *http.Request) string {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	addr := peer.Addr().Unmap()
	if s.trusted(addr) {
		if forwarded, ok := s.forwardedClient(r.Header.Values("X-Forwarded-For")); ok {
			addr = forwarded
		}
	}
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

// forwardedClient walks the X-Forwarded-For fields from the right, past the
// trusted proxies, to the first address that is not one. Every field being
// a trusted proxy gives the leftmost; an unusable field, or none, gives
// false.
func (s *Server) forwardedClient(fields []string) (netip.Addr, bool) {
	hops := strings.Split(strings.Join(fields, ","), ",")
	var last netip.Addr
	for i := len(hops) - 1; i >= 0; i-- {
		addr, ok := parseHop(hops[i])
		if !ok {
			return netip.Addr{}, false
		}
		if !s.trusted(addr) {
			return addr, true
		}
		last = addr
	}
	return last, last.IsValid()
}

// parseHop reads one X-Forwarded-For entry: an address, with or without a
// port (192.0.2.7, 192.0.2.7:5100, 2001:db8::1, [2001:db8::1]:5100).
func parseHop(hop string) (netip.Addr, bool) {
	hop = strings.TrimSpace(hop)
	if addr, err := netip.ParseAddr(hop); err == nil {
		return addr.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(hop); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// trusted reports whether addr is one of Options.TrustedProxies.
func (s *Server) trusted(addr netip.Addr) bool {
	for _, p := range s.opts.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
