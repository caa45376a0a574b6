package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/testkit/respell"
)

// requestShapes are the bodies the POST endpoints decode, each with its route.
func requestShapes() []struct {
	path string
	new  func() any
} {
	return []struct {
		path string
		new  func() any
	}{
		{"/v1/accounts", func() any { return new(accountRequest) }},
		{"/v1/accounts/acct_00000000000000000000000000000001/deposits", func() any { return new(depositRequest) }},
		{"/v1/charges", func() any { return new(chargeRequest) }},
		{"/v1/charges/ch_00000000000000000000000000000001/refunds", func() any { return new(amountRequest) }},
		{"/v1/charges/ch_00000000000000000000000000000001/capture", func() any { return new(amountRequest) }},
		{"/v1/charges/ch_00000000000000000000000000000001/void", func() any { return new(struct{}) }},
	}
}

// FuzzDecode feeds arbitrary bytes to the request decoding of every POST
// body. It never panics; a refusal is a 400 invalid-request problem naming
// what is wrong; and a body that both the decoder and the canonicaliser
// accept is fingerprinted faithfully: its canonical form decodes to the same
// request, and the same document written with other member order, whitespace
// and escapes has the same canonical form and fingerprint and decodes to the
// same request. (Were two different requests to share a fingerprint, a retry
// of one with the other's key would be answered with the other's response.)
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"account_id":"acct_0193a1b2c3d4e5f60718293a4b5c6d7e","amount":2500,"currency":"EUR","description":"order 1001","metadata":{"order":"1001"}}`,
		`{"currency":"USD"}`, `{"amount":1}`, `{}`, `null`, `[]`, `{"amount":1e2}`, `{"amount":"1"}`, `{"amount":1.5}`,
		`{"amount":99999999999999999999}`, `{"unknown":1}`, `{"metadata":{"a":1}}`, `{"amount":1} {"amount":2}`,
		`{"description":"\u00e9\ud83d\ude00"}`, `{"amount":1,"amount":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		canonical, canonErr := idempotency.Canonicalize(body)
		for _, shape := range requestShapes() {
			dst := shape.new()
			p, ok := decodeStrict(body, dst)
			if !ok {
				if p.Status != http.StatusBadRequest || p.Code != probInvalidRequest.slug || p.Detail == "" {
					t.Fatalf("%s: refusal of %q is %+v, want a 400 invalid-request with a detail", shape.path, body, p)
				}
				continue
			}
			if r, isCharge := dst.(*chargeRequest); isCharge {
				_, _ = r.toDomain() // validation never panics either
			}
			if canonErr != nil {
				continue // readPost refuses it
			}
			// The canonical form is the request the fingerprint stands for.
			again := shape.new()
			if _, ok := decodeStrict(canonical, again); !ok || !reflect.DeepEqual(dst, again) {
				t.Fatalf("%s: %q decodes to %s, but its canonical form %q (what the fingerprint stands for) to %s",
					shape.path, body, show(dst), canonical, show(again))
			}
			// So is any other spelling of the same document.
			variant := respelled(t, respell.All, body)
			canonicalVariant, err := idempotency.Canonicalize(variant)
			if err != nil || !bytes.Equal(canonicalVariant, canonical) {
				t.Fatalf("%q and its respelling %q canonicalise to %q and %q (%v)", body, variant, canonical, canonicalVariant, err)
			}
			if idempotency.NewFingerprint(http.MethodPost, shape.path, canonical) !=
				idempotency.NewFingerprint(http.MethodPost, shape.path, canonicalVariant) {
				t.Fatalf("%q and %q: different fingerprints", body, variant)
			}
			// Numbers keep their spelling here: the decoder takes only
			// integer literals for amounts, and refuses 1.0E0 (a 400 before
			// the key is claimed, so no fingerprint is at stake).
			variant = respelled(t, respell.KeepingNumbers, body)
			fromVariant := shape.new()
			if _, ok := decodeStrict(variant, fromVariant); !ok || !reflect.DeepEqual(dst, fromVariant) {
				t.Fatalf("%s: %q decodes to %s, its respelling %q to %s", shape.path, body, show(dst), variant, show(fromVariant))
			}
		}
	})
}

// FuzzReadPost drives everything a POST goes through before its key is
// claimed (Idempotency-Key, Content-Type, size, JSON) with arbitrary input. It
// never panics; a refusal is a problem (400, 413 or 415) with its code; an
// acceptance carries the key the header names (bare or quoted) and the
// fingerprint of the canonical body.
func FuzzReadPost(f *testing.F) {
	f.Add("application/json", "550e8400-e29b-41d4-a716-446655440000", []byte(`{"amount":100}`))
	f.Add("application/json; charset=utf-8", "k", []byte(`{ "amount" : 1 }`))
	f.Add("text/plain", "k", []byte(`{"amount":1}`))
	f.Add("application/json", "", []byte(`{"amount":1}`))
	f.Add("application/json", "a b", []byte(`{"amount":1}`))
	f.Add("application/json", `"k\"1"`, []byte(`{"amount":1}`))
	f.Add("application/json; charset=latin1", "k", []byte(`{}`))
	f.Add("application/json", "k", []byte(`{"amount":1,"extra":true}`))
	srv := New(nil, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	f.Fuzz(func(t *testing.T, contentType, key string, body []byte) {
		const path = "/v1/accounts/acct_00000000000000000000000000000001/deposits"
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		if key != "" {
			r.Header["Idempotency-Key"] = []string{key}
		}
		w := httptest.NewRecorder()
		var in depositRequest
		req, ok := srv.readPost(w, r, &in)
		if !ok {
			var p problem
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != w.Code || p.Code == "" {
				t.Fatalf("refusal %d %q is not a problem with a code (%v)", w.Code, w.Body.Bytes(), err)
			}
			switch w.Code {
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
			default:
				t.Fatalf("refused with %d %s before the key is claimed; want 400, 413 or 415", w.Code, w.Body.Bytes())
			}
			return
		}
		if w.Body.Len() != 0 {
			t.Fatalf("accepted, but wrote %q", w.Body.Bytes())
		}
		if want, err := idempotency.ParseKey(r.Header); err != nil || req.Key != want {
			t.Fatalf("key %q, header %q naming %q (%v)", req.Key, key, want, err)
		}
		canonical, err := idempotency.Canonicalize(body)
		if err != nil || req.Fingerprint != idempotency.NewFingerprint(http.MethodPost, path, canonical) {
			t.Fatalf("accepted %q, but its fingerprint is not that of its canonical form (%v)", body, err)
		}
	})
}

// respelled is body respelled by how, which must take it.
func respelled(t *testing.T, how func([]byte) ([]byte, error), body []byte) []byte {
	t.Helper()
	out, err := how(body)
	if err != nil {
		t.Fatalf("respell %q: %v", body, err)
	}
	return out
}

// show renders a decoded request, pointers followed.
func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// decodeStrict is decodeBody with the problem readPost would answer with,
// for the tests.
func decodeStrict(body []byte, dst any) (problem, bool) {
	_, err := decodeBody(body, dst)
	if err == nil {
		return problem{}, true
	}
	p, _ := problemFor(err)
	return problemFromError(p, err), false
}
