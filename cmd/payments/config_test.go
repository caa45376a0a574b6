package main

import (
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTrustedProxiesSetting: TRUSTED_PROXIES takes CIDRs and single
// addresses, comma-separated, and is empty (no proxy trusted) by default; a
// value that is neither stops the service at start, naming the variable.
func TestTrustedProxiesSetting(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []netip.Prefix
	}{
		{"", nil},
		{"10.0.0.0/8", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{" 10.1.2.3/8, 192.0.2.7 ,fd00::/8,2001:db8::1", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("2001:db8::1/128")}},
	} {
		cfg, err := loadConfig("serve", nil, envOf(map[string]string{"TRUSTED_PROXIES": tc.value}), io.Discard, io.Discard)
		if err != nil || !slices.Equal(cfg.HTTP.TrustedProxies, tc.want) {
			t.Errorf("TRUSTED_PROXIES=%q: %v, %v; want %v", tc.value, cfg.HTTP.TrustedProxies, err, tc.want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "proxy.internal", "10.0.0.0/8;192.0.2.7"} {
		_, err := loadConfig("serve", nil, envOf(map[string]string{"TRUSTED_PROXIES": bad}), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "invalid TRUSTED_PROXIES") {
			t.Errorf("TRUSTED_PROXIES=%q: %v, want an error naming TRUSTED_PROXIES", bad, err)
		}
	}
}

// TestProcessorSettings: the processor's settings load with their defaults,
// and values that would break a card charge's bounds stop the service at
// start, naming the variable to blame.
func TestProcessorSettings(t *testing.T) {
	cfg, err := loadConfig("serve", nil, envOf(map[string]string{"PROCESSOR_URL": "http://127.0.0.1:8090"}), io.Discard, io.Discard)
	if p := cfg.Processor; err != nil || p.URL != "http://127.0.0.1:8090" || p.Wait != 5*time.Second || p.Timeout != 30*time.Second ||
		p.DecisionDeadline != 120*time.Second || p.RecoveryInterval != time.Second {
		t.Errorf("defaults: %+v, %v", cfg.Processor, err)
	}
	for _, tc := range []struct {
		env   map[string]string
		blame string
	}{
		{map[string]string{"PROCESSOR_URL": "127.0.0.1:8090"}, "invalid PROCESSOR_URL"},
		{map[string]string{"PROCESSOR_WAIT": "25s"}, "invalid PROCESSOR_WAIT"},
		{map[string]string{"PROCESSOR_TIMEOUT": "2m"}, "invalid PROCESSOR_DECISION_DEADLINE"},
		{map[string]string{"PROCESSOR_DECISION_DEADLINE": "30s"}, "invalid PROCESSOR_DECISION_DEADLINE"},
		{map[string]string{"PROCESSOR": "adyen"}, "invalid PROCESSOR"},
		{map[string]string{"PROCESSOR": "simulator"}, "invalid PROCESSOR: simulator needs PROCESSOR_URL"},
		{map[string]string{"PROCESSOR": "stripe"}, "invalid PROCESSOR: stripe needs STRIPE_API_KEY"},
		{map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_1", "PROCESSOR_URL": "http://127.0.0.1:8090"}, "invalid PROCESSOR_URL"},
		{map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_1", "PROCESSOR_WEBHOOK_SECRET": "s"}, "invalid PROCESSOR_WEBHOOK_SECRET"},
		{map[string]string{"PROCESSOR": "none", "PROCESSOR_URL": "http://127.0.0.1:8090"}, "invalid PROCESSOR_URL"},
		{map[string]string{"STRIPE_API_KEY": "sk_test_1"}, "invalid STRIPE_API_KEY"},
		{map[string]string{"PROCESSOR_URL": "http://127.0.0.1:8090", "STRIPE_WEBHOOK_SECRET": "whsec_1"}, "invalid STRIPE_WEBHOOK_SECRET"},
		{map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_1", "STRIPE_API_BASE": "localhost:12111"}, "invalid STRIPE_API_BASE"},
		{map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_1", "STRIPE_ACCOUNT": "42"}, "invalid STRIPE_ACCOUNT"},
	} {
		if _, err := loadConfig("serve", nil, envOf(tc.env), io.Discard, io.Discard); err == nil || !strings.HasPrefix(err.Error(), tc.blame) {
			t.Errorf("%v: %v, want %s", tc.env, err, tc.blame)
		}
		if err != nil && strings.Contains(err.Error(), "sk_test_1") {
			t.Errorf("%v: %v names the API key", tc.env, err)
		}
	}
	cfg, err = loadConfig("serve", nil, envOf(map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_1",
		"STRIPE_ACCOUNT": "acct_1", "STRIPE_WEBHOOK_SECRET": "whsec_1"}), io.Discard, io.Discard)
	if s := cfg.Processor.Stripe; err != nil || cfg.Processor.kind() != processorStripe || s.APIKey != "sk_test_1" || s.Account != "acct_1" || s.WebhookSecret != "whsec_1" {
		t.Errorf("stripe: %+v, %v", cfg.Processor, err)
	}
}
