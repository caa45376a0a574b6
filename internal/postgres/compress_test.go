package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

func TestEncodeBody(t *testing.T) {
	small := []byte(`{"id":"ch_1"}`)
	if got, enc := encodeBody(small); enc != nil || !bytes.Equal(got, small) {
		t.Errorf("a small body was encoded (%v)", enc)
	}
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(i*7919 + i/3) // little redundancy for zstd to find
	}
	large := bigChargeBody(t)
	for _, body := range [][]byte{large, random} {
		stored, enc := encodeBody(body)
		if enc != nil && len(stored) >= len(body) {
			t.Errorf("compressed a %d-byte body to %d bytes", len(body), len(stored))
		}
		back, err := decodeBody(stored, enc)
		if err != nil || !bytes.Equal(back, body) {
			t.Fatalf("round trip failed: %v", err)
		}
	}
	if _, enc := encodeBody(large); enc == nil {
		t.Error("a charge with large metadata was not compressed")
	}
	// The bound is inclusive: 1 KiB of the most compressible bytes is kept as
	// it is, one byte more is compressed.
	atBound := bytes.Repeat([]byte("a"), compressAbove)
	if _, enc := encodeBody(atBound); enc != nil {
		t.Errorf("a body of exactly %d bytes was compressed", compressAbove)
	}
	if _, enc := encodeBody(append(atBound, 'a')); enc == nil {
		t.Errorf("a compressible body of %d bytes was not compressed", compressAbove+1)
	}
	bad := "gzip"
	if _, err := decodeBody([]byte("x"), &bad); err == nil {
		t.Error("an unknown encoding decoded")
	}
}

// bigChargeBody renders a charge carrying the most metadata the API allows
// in keys, with 40-character values: a realistic large response.
func bigChargeBody(t testing.TB) []byte {
	meta := map[string]string{}
	for i := range payment.MaxMetadataKeys {
		meta[fmt.Sprintf("order_line_%02d", i)] = fmt.Sprintf("sku-%06d qty=%d note=%s", i*37, i%5+1, strings.Repeat("x", 16))
	}
	a := &payment.Account{ID: payment.NewID(), Currency: "EUR", Balance: 1999}
	c, err := payment.ChargeAccount(a, payment.NewID(), payment.NewCharge{AccountID: a.ID, Amount: 1999, Currency: "EUR", Metadata: meta},
		time.Now().UTC().Truncate(time.Microsecond), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// BenchmarkStoredBodySize measures what a large response costs in the table:
// its raw size, what PostgreSQL stores for it as is (pg_column_size, after
// its own TOAST compression if any), and what it stores zstd-compressed.
//
//	go test -run '^$' -bench StoredBodySize -benchtime 1x ./internal/postgres/
func BenchmarkStoredBodySize(b *testing.B) {
	s, err := Open(context.Background(), pgtest.NewDatabase(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	body := bigChargeBody(b)
	compressed, enc := encodeBody(body)
	if enc == nil {
		b.Fatal("not compressed")
	}
	ctx := context.Background()
	merchant := uuid.New()
	var rawStored, zstdStored int
	for range b.N {
		for _, v := range []struct {
			key  string
			body []byte
			size *int
		}{{"raw", body, &rawStored}, {"zstd", compressed, &zstdStored}} {
			_, err := s.Pool().Exec(ctx, `
INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, body)
VALUES ($1, $2, '\x00', 201, $3)
ON CONFLICT (merchant_id, key) DO UPDATE SET body = excluded.body`, merchant, v.key, v.body)
			if err != nil {
				b.Fatal(err)
			}
			// Read back from the table: what is stored, after TOAST.
			err = s.Pool().QueryRow(ctx, `SELECT pg_column_size(body) FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`,
				merchant, v.key).Scan(v.size)
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(body)), "raw-bytes")
	b.ReportMetric(float64(rawStored), "stored-plain-bytes")
	b.ReportMetric(float64(zstdStored), "stored-bytes")
}
