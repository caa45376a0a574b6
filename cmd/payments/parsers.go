package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// parser reads a setting's text into the config; typ names what it reads,
// for -h: duration, size, int, bool, ...
type parser struct {
	typ string
	set func(string) error
}

func nonEmpty(v string) error {
	if v == "" {
		return fmt.Errorf("must not be empty")
	}
	return nil
}

// wholeNumber parses an integer of 0 or more into n.
func wholeNumber(n *int) parser { return intAtLeast(n, 0, "a whole number") }

// rateInto parses a whole number of requests a second, 0 for no limit, into
// r.
func rateInto(r *float64) parser {
	var n int
	p := intAtLeast(&n, 0, "a whole number of requests a second (0: no limit)")
	return parser{p.typ, func(v string) error {
		if err := p.set(v); err != nil {
			return err
		}
		*r = float64(n)
		return nil
	}}
}

// positiveInt parses an integer of 1 or more into n.
func positiveInt(n *int) parser { return intAtLeast(n, 1, "a positive integer") }

// intAtLeast parses an integer of floor or more into n; want names such a
// number in the error.
func intAtLeast(n *int, floor int, want string) parser {
	return parser{"int", func(v string) error {
		parsed, err := strconv.Atoi(v)
		if err != nil || parsed < floor {
			return fmt.Errorf("want %s, got %q", want, v)
		}
		*n = parsed
		return nil
	}}
}

// sizeInto parses a size in bytes (parseBytes) into n.
func sizeInto(n *int64) parser {
	return parser{"size", func(v string) (err error) {
		*n, err = parseBytes(v)
		return err
	}}
}

// parseBytes reads a size such as 1048576, 512KiB, 64MiB or 1GiB.
func parseBytes(v string) (int64, error) {
	digits, unit := v, int64(1)
	for suffix, size := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if d, ok := strings.CutSuffix(v, suffix); ok {
			digits, unit = d, size
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/unit {
		return 0, fmt.Errorf("want a size in bytes such as 67108864 or 64MiB (at most 1TiB), got %q", v)
	}
	return n * unit, nil
}

// durationInto parses a positive duration into d.
func durationInto(d *time.Duration) parser {
	return parser{"duration", func(v string) error {
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed <= 0 {
			return fmt.Errorf("want a positive duration such as 5s or 24h, got %q", v)
		}
		*d = parsed
		return nil
	}}
}

// durationOrZero parses a duration of 0 or more into d.
func durationOrZero(d *time.Duration) parser {
	return parser{"duration", func(v string) error {
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed < 0 {
			return fmt.Errorf("want a duration such as 5s, or 0 for none, got %q", v)
		}
		*d = parsed
		return nil
	}}
}

// parsePrefixes reads a comma-separated list of CIDRs (10.0.0.0/8,
// fd00::/8) or single addresses (192.0.2.7); empty is none.
func parsePrefixes(v string) ([]netip.Prefix, error) {
	var prefixes []netip.Prefix
	for _, field := range strings.Split(v, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			continue
		}
		p, err := netip.ParsePrefix(field)
		if err != nil {
			addr, addrErr := netip.ParseAddr(field)
			if addrErr != nil {
				return nil, fmt.Errorf("want addresses or CIDRs such as 10.0.0.0/8,192.0.2.7, got %q", field)
			}
			p = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
		}
		prefixes = append(prefixes, p.Masked())
	}
	return prefixes, nil
}

// durationAtLeast parses a duration of at least floor into d.
func durationAtLeast(d *time.Duration, floor time.Duration) parser {
	return parser{"duration", func(v string) error {
		if err := durationInto(d).set(v); err != nil {
			return err
		}
		if *d < floor {
			return fmt.Errorf("want at least %s, got %q", floor, v)
		}
		return nil
	}}
}

// boolInto parses a boolean into b, as strconv.ParseBool reads it: true,
// false, 1, 0 and their other spellings. Its flag takes the value as every
// setting's does (--relay false), not alone.
func boolInto(b *bool) parser {
	return parser{"bool", func(v string) (err error) {
		*b, err = strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		return nil
	}}
}
