package httpapi

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/exactlyonce/payments/internal/idempotency"
)

// A charge request as clients send it.
var benchChargeBody = []byte(`{"account_id":"acct_0193a1b2c3d4e5f60718293a4b5c6d7e","amount":2500,"currency":"EUR",` +
	`"description":"order 1001","metadata":{"order":"1001","customer":"c-42"}}`)

// BenchmarkDecodeCharge prices what readPost does with a charge body: today,
// one parse that yields both the canonical form and the fields; "three-parses"
// is what it did before (canonicalise; unmarshal into a map to check member
// names; decode into the struct), kept here as the yardstick.
//
//	go test -run '^$' -bench DecodeCharge -benchmem -count 5 ./internal/httpapi/
func BenchmarkDecodeCharge(b *testing.B) {
	b.Run("one-parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in chargeRequest
			if _, ok := decodeStrict(benchChargeBody, &in); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("three-parses", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := idempotency.Canonicalize(benchChargeBody); err != nil {
				b.Fatal(err)
			}
			var members map[string]json.RawMessage
			if err := json.Unmarshal(benchChargeBody, &members); err != nil {
				b.Fatal(err)
			}
			var in chargeRequest
			dec := json.NewDecoder(bytes.NewReader(benchChargeBody))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
