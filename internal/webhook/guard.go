package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
)

// Errors of CheckURL and of NewClient's connections. Their text names the
// reason and nothing of this network (no resolver address): it may be shown
// to the merchant, as a 400 on the field "url".
var (
	// ErrForbidden: the URL is not one the service sends to (scheme, user
	// info, no host), or its host is or resolves to an address it must not
	// reach (loopback, private, link-local, ...).
	ErrForbidden = errors.New("webhook url refused")
	// ErrUnresolved: the URL's host has no address, or none could be found
	// now. The error also wraps the resolver's, for errors.As.
	ErrUnresolved = errors.New("webhook url: host not resolved")
)

// Resolver finds a host's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// CheckURL says whether the service may send webhooks to rawURL. It refuses
// a URL that is not absolute https, has user info or no host, or whose host
// is an address (or a name any of whose addresses is) that is not global
// unicast: loopback, private (RFC 1918, fc00::/7), link-local, multicast,
// unspecified, shared (CGNAT, 100.64/10), reserved or for documentation,
// IPv4-mapped or embedded (NAT64, 6to4) forms of those included. Any port is
// allowed. A nil resolver is net.DefaultResolver. With allowPrivate (for
// development and tests) it allows http too and checks no address.
//
// A name can resolve elsewhere by the time of a delivery (DNS rebinding), so
// this check is for an early, clear refusal; NewClient checks each address
// again as it connects.
//
// It returns nil, an error wrapping ErrForbidden, one wrapping ErrUnresolved,
// or the context's error.
func CheckURL(ctx context.Context, rawURL string, resolver Resolver, allowPrivate bool) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("%w: not a URL", ErrForbidden)
	}
	switch {
	case u.Scheme == "https", u.Scheme == "http" && allowPrivate:
	case allowPrivate:
		return fmt.Errorf("%w: the scheme must be https or http", ErrForbidden)
	default:
		return fmt.Errorf("%w: the scheme must be https", ErrForbidden)
	}
	host := u.Hostname()
	switch {
	case u.Opaque != "" || host == "":
		return fmt.Errorf("%w: the URL has no host", ErrForbidden)
	case u.User != nil:
		return fmt.Errorf("%w: the URL must not hold a user or password", ErrForbidden)
	case allowPrivate:
		return nil
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if why := forbidden(addr); why != "" {
			return fmt.Errorf("%w: the host %s is %s", ErrForbidden, host, why)
		}
		return nil
	}
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	addrs, err := resolver.LookupNetIP(ctx, "ip", host)
	if ctx.Err() != nil {
		return fmt.Errorf("resolve webhook host: %w", ctx.Err())
	}
	if err != nil || len(addrs) == 0 {
		return &resolveError{host: host, err: err}
	}
	// Every address, as a dialer may use any of them.
	for _, a := range addrs {
		if why := forbidden(a); why != "" {
			return fmt.Errorf("%w: the host %s resolves to %s, %s", ErrForbidden, host, a.Unmap(), why)
		}
	}
	return nil
}

// resolveError wraps ErrUnresolved and the resolver's error, whose text
// (the resolver's address) it leaves out.
type resolveError struct {
	host string
	err  error // nil when the resolver found no address
}

func (e *resolveError) Error() string {
	var dns *net.DNSError
	if e.err == nil || errors.As(e.err, &dns) && dns.IsNotFound {
		return "webhook url: the host " + e.host + " has no address"
	}
	return "webhook url: the host " + e.host + " could not be resolved now"
}

func (e *resolveError) Unwrap() []error { return []error{ErrUnresolved, e.err} }

// special are the ranges of the IANA special-purpose registries that are
// global unicast to netip but not destinations on the internet.
var special = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `a "this network" address`},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (CGNAT) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("100::/64"), "a discard-only address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
}

// Prefixes whose addresses carry an IPv4 address that a gateway reaches.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // the last 4 bytes
	sixToFour = netip.MustParsePrefix("2002::/16")    // bytes 2 to 5
)

// forbidden returns why the service must not connect to a (an article and a
// noun: "a loopback address"), or "" if it may.
func forbidden(a netip.Addr) string {
	if a.Zone() != "" {
		return "an address with a zone" // only link-local addresses have one
	}
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsUnspecified():
		return "an unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsPrivate():
		return "a private address"
	case a.IsMulticast(): // link-local and interface-local ones included
		return "a multicast address"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	}
	for _, s := range special {
		if s.prefix.Contains(a) {
			return s.why
		}
	}
	b := a.As16()
	var v4 netip.Addr
	switch {
	case nat64.Contains(a):
		v4 = netip.AddrFrom4([4]byte(b[12:16]))
	case sixToFour.Contains(a):
		v4 = netip.AddrFrom4([4]byte(b[2:6]))
	}
	if v4.IsValid() {
		if why := forbidden(v4); why != "" {
			return why + " (" + v4.String() + ") behind a translating prefix"
		}
	}
	if !a.IsGlobalUnicast() {
		return "not a global unicast address"
	}
	return ""
}
