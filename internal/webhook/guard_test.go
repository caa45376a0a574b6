package webhook_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/internal/webhook"
)

// *net.Resolver is what the service passes.
var _ webhook.Resolver = net.DefaultResolver

// fakeDNS answers from a table, so a test can give a name any addresses; a
// name it does not hold is not found.
type fakeDNS map[string][]string

func (d fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	addrs, ok := d[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.9.9.9:53", IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

var dns = fakeDNS{
	"hooks.example.com": {"93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"},
	"internal.example":  {"10.0.0.7"},
	"mixed.example":     {"93.184.215.14", "192.168.0.1"},
	"rebind.example":    {"::1"},
	"mapped.example":    {"::ffff:169.254.169.254"},
	"metadata.example":  {"fd00:ec2::254"},
	"empty.example":     {},
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url          string
		allowPrivate bool
		want         error  // nil, ErrForbidden or ErrUnresolved
		reason       string // a part of the error's text
	}{
		// Where a forged request aims first (loopback, private, cloud metadata),
		// refused for their scheme, then for their address.
		{url: "http://127.0.0.1", want: webhook.ErrForbidden, reason: "must be https"},
		{url: "http://[::1]", want: webhook.ErrForbidden, reason: "must be https"},
		{url: "http://10.0.0.1", want: webhook.ErrForbidden, reason: "must be https"},
		{url: "http://169.254.169.254", want: webhook.ErrForbidden, reason: "must be https"},
		{url: "https://127.0.0.1/hook", want: webhook.ErrForbidden, reason: "127.0.0.1 is a loopback address"},
		{url: "https://[::1]:8443/hook", want: webhook.ErrForbidden, reason: "is a loopback address"},
		{url: "https://10.0.0.1", want: webhook.ErrForbidden, reason: "is a private address"},
		{url: "https://169.254.169.254/latest/meta-data/", want: webhook.ErrForbidden, reason: "is a link-local address"},

		// Every other kind of address that is not on the internet.
		{url: "https://172.16.0.1", want: webhook.ErrForbidden, reason: "private"},
		{url: "https://192.168.1.1:8443", want: webhook.ErrForbidden, reason: "private"},
		{url: "https://[fc00::1]", want: webhook.ErrForbidden, reason: "private"},
		{url: "https://[fd12:3456::1]", want: webhook.ErrForbidden, reason: "private"},
		{url: "https://[fe80::1]", want: webhook.ErrForbidden, reason: "link-local"},
		{url: "https://[fe80::1%25eth0]", want: webhook.ErrForbidden, reason: "zone"},
		{url: "https://224.0.0.1", want: webhook.ErrForbidden, reason: "multicast"},
		{url: "https://[ff02::1]", want: webhook.ErrForbidden, reason: "multicast"},
		{url: "https://[ff0e::1]", want: webhook.ErrForbidden, reason: "multicast"},
		{url: "https://[ff01::1]", want: webhook.ErrForbidden, reason: "multicast"},
		{url: "https://239.1.2.3", want: webhook.ErrForbidden, reason: "multicast"},
		{url: "https://0.0.0.0", want: webhook.ErrForbidden, reason: "unspecified"},
		{url: "https://[::]", want: webhook.ErrForbidden, reason: "unspecified"},
		{url: "https://0.1.2.3", want: webhook.ErrForbidden, reason: "this network"},
		{url: "https://100.64.0.1", want: webhook.ErrForbidden, reason: "CGNAT"},
		{url: "https://100.127.255.254", want: webhook.ErrForbidden, reason: "CGNAT"},
		{url: "https://192.0.2.10", want: webhook.ErrForbidden, reason: "documentation"},
		{url: "https://198.18.0.1", want: webhook.ErrForbidden, reason: "benchmarking"},
		{url: "https://240.0.0.1", want: webhook.ErrForbidden, reason: "reserved"},
		{url: "https://255.255.255.255", want: webhook.ErrForbidden, reason: "reserved"},
		{url: "https://[2001:db8::1]", want: webhook.ErrForbidden, reason: "documentation"},
		{url: "https://[::ffff:127.0.0.1]", want: webhook.ErrForbidden, reason: "loopback"},
		{url: "https://[::ffff:a00:1]", want: webhook.ErrForbidden, reason: "private"},
		{url: "https://[::127.0.0.1]", want: webhook.ErrForbidden, reason: "IPv4-compatible"},
		{url: "https://[64:ff9b::a00:1]", want: webhook.ErrForbidden, reason: "private address (10.0.0.1)"},
		{url: "https://[64:ff9b::a9fe:a9fe]", want: webhook.ErrForbidden, reason: "link-local address (169.254.169.254)"},
		{url: "https://[2002:7f00:1::1]", want: webhook.ErrForbidden, reason: "loopback address (127.0.0.1)"},

		// Names, every address of which counts.
		{url: "https://internal.example/hook", want: webhook.ErrForbidden, reason: "internal.example resolves to 10.0.0.7, a private address"},
		{url: "https://mixed.example/hook", want: webhook.ErrForbidden, reason: "resolves to 192.168.0.1"},
		{url: "https://rebind.example/hook", want: webhook.ErrForbidden, reason: "loopback"},
		{url: "https://mapped.example/hook", want: webhook.ErrForbidden, reason: "resolves to 169.254.169.254, a link-local"},
		{url: "https://metadata.example/hook", want: webhook.ErrForbidden, reason: "private"},
		{url: "https://nowhere.example/hook", want: webhook.ErrUnresolved, reason: "nowhere.example has no address"},
		{url: "https://empty.example/hook", want: webhook.ErrUnresolved, reason: "has no address"},

		// The URL itself.
		{url: "ftp://hooks.example.com/", want: webhook.ErrForbidden, reason: "scheme"},
		{url: "hooks.example.com/hook", want: webhook.ErrForbidden, reason: "scheme"},
		{url: "//hooks.example.com/hook", want: webhook.ErrForbidden, reason: "scheme"},
		{url: "https:hooks.example.com", want: webhook.ErrForbidden, reason: "no host"},
		{url: "https:///hook", want: webhook.ErrForbidden, reason: "no host"},
		{url: "https://:443/hook", want: webhook.ErrForbidden, reason: "no host"},
		{url: "https://user:secret@hooks.example.com/", want: webhook.ErrForbidden, reason: "user or password"},
		{url: "https://user@hooks.example.com/", want: webhook.ErrForbidden, reason: "user or password"},
		{url: "https://hooks.example.com/%zz", want: webhook.ErrForbidden, reason: "not a URL"},
		{url: "", want: webhook.ErrForbidden, reason: "scheme"},

		// Allowed: public addresses and names, any port, any path.
		{url: "https://hooks.example.com/payments?merchant=7#x"},
		{url: "https://hooks.example.com:8443/"},
		{url: "https://8.8.8.8/hook"},
		{url: "https://[2606:4700:4700::1111]:9443/hook"},
		{url: "https://[64:ff9b::808:808]/hook"}, // NAT64 of 8.8.8.8
		{url: "HTTPS://hooks.example.com/"},

		// allowPrivate (development and tests): http and local addresses, no lookup.
		{url: "http://127.0.0.1:8080/hook", allowPrivate: true},
		{url: "http://[::1]/hook", allowPrivate: true},
		{url: "https://10.0.0.1/hook", allowPrivate: true},
		{url: "http://nowhere.example/hook", allowPrivate: true},
		{url: "ftp://127.0.0.1/", allowPrivate: true, want: webhook.ErrForbidden, reason: "https or http"},
		{url: "http://user:pw@127.0.0.1/", allowPrivate: true, want: webhook.ErrForbidden, reason: "user or password"},
		{url: "http:///hook", allowPrivate: true, want: webhook.ErrForbidden, reason: "no host"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			err := webhook.CheckURL(context.Background(), tt.url, dns, tt.allowPrivate)
			if !errors.Is(err, tt.want) {
				t.Fatalf("CheckURL(%q, allowPrivate %v) = %v, want %v", tt.url, tt.allowPrivate, err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("CheckURL(%q) = %q, want it to say %q", tt.url, err, tt.reason)
			}
		})
	}
}

// The system's resolver: localhost is a name that resolves to loopback.
func TestCheckURLLocalhost(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://localhost/hook", "https://localhost:8443/hook", "https://LOCALHOST/"} {
		err := webhook.CheckURL(context.Background(), u, nil, false)
		if !errors.Is(err, webhook.ErrForbidden) || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("CheckURL(%q) = %v, want a refusal naming loopback", u, err)
		}
	}
	// Spellings of 127.0.0.1 that inet_aton accepts and netip does not are
	// names to the resolver, and the rooted localhost. is one to some
	// resolvers only: refused either way.
	for _, u := range []string{"https://127.1/", "https://2130706433/", "https://0x7f.0.0.1/", "https://localhost./"} {
		err := webhook.CheckURL(context.Background(), u, net.DefaultResolver, false)
		if !errors.Is(err, webhook.ErrForbidden) && !errors.Is(err, webhook.ErrUnresolved) {
			t.Errorf("CheckURL(%q) = %v, want it refused", u, err)
		}
	}
}

// A resolver's failure is wrapped for errors.As, but its text (the
// resolver's own address) is not in the message a merchant may see.
func TestCheckURLResolverError(t *testing.T) {
	t.Parallel()
	err := webhook.CheckURL(context.Background(), "https://nowhere.example/", dns, false)
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Fatalf("CheckURL = %v, want it to wrap the resolver's *net.DNSError", err)
	}
	if strings.Contains(err.Error(), "10.9.9.9") {
		t.Errorf("CheckURL's message %q shows the resolver's address", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := webhook.CheckURL(ctx, "https://localhost/", nil, false); !errors.Is(err, context.Canceled) {
		t.Errorf("CheckURL with a cancelled context = %v, want context.Canceled", err)
	}
}
