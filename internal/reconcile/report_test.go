package reconcile_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/reconcile"
)

// report has a matched reference and one missing on our side.
func report() reconcile.Report {
	ours := op(payment.ChargeSucceeded, 1000, 0)
	stray := pay("authorized", 500, 0, 0)
	stray.Reference, stray.PSPReference, stray.Amount, stray.ApprovedAmount = "ch_2", "psp_b", 500, 500
	lines := reconcile.Compare([]reconcile.Operation{*ours}, []processor.Payment{pay("captured", 1000, 1000, 0), stray},
		reconcile.Window{Since: since, Until: until, Now: now, Settle: 10 * time.Minute})
	counts := map[reconcile.Result]int{}
	for _, r := range reconcile.Results {
		counts[r] = 0
	}
	counts[reconcile.Matched], counts[reconcile.MissingOnOurSide] = 1, 1
	return reconcile.Report{Run: reconcile.Run{Processor: "simulator http://sim", Since: since, Until: until, FinishedAt: now, Counts: counts},
		Settle: 10 * time.Minute, Lines: lines}
}

// TestWriteCSV writes the report as CSV, byte for byte.
func TestWriteCSV(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := reconcile.WriteCSV(&b, report()); err != nil {
		t.Fatal(err)
	}
	want := `reference,result,detail,our_status,our_amount,our_captured,our_refunded,currency,processor_status,processor_approved,processor_captured,processor_refunded,psp_references
ch_1,matched,,succeeded,1000,1000,0,EUR,captured,1000,1000,0,psp_a
ch_2,missing_on_our_side,the processor has psp_b authorized 500/0/0; we have no operation under this reference,,,,,EUR,authorized,500,0,0,psp_b
`
	if b.String() != want {
		t.Errorf("CSV:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestWriteJSON writes the report as JSON, byte for byte.
func TestWriteJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := reconcile.WriteJSON(&b, report()); err != nil {
		t.Fatal(err)
	}
	want := `{
  "processor": "simulator http://sim",
  "since": "2026-12-01T00:00:00Z",
  "until": "2026-12-02T00:00:00Z",
  "settle": "10m0s",
  "finished_at": "2026-12-02T00:05:00Z",
  "counts": {
    "amount_mismatch": 0,
    "matched": 1,
    "missing_at_processor": 0,
    "missing_on_our_side": 1,
    "pending": 0,
    "state_mismatch": 0
  },
  "mismatches": 1,
  "references": [
    {
      "reference": "ch_1",
      "result": "matched",
      "ours": {
        "state": "succeeded",
        "status": "succeeded",
        "amount": 1000,
        "amount_captured": 1000,
        "amount_refunded": 0,
        "currency": "EUR",
        "created_at": "2026-12-01T01:00:00Z"
      },
      "processor": [
        {
          "psp_reference": "psp_a",
          "status": "captured",
          "amount": 1000,
          "currency": "EUR",
          "approved_amount": 1000,
          "captured_amount": 1000,
          "refunded_amount": 0,
          "created": "2026-12-01T01:00:01Z"
        }
      ]
    },
    {
      "reference": "ch_2",
      "result": "missing_on_our_side",
      "detail": "the processor has psp_b authorized 500/0/0; we have no operation under this reference",
      "ours": null,
      "processor": [
        {
          "psp_reference": "psp_b",
          "status": "authorized",
          "amount": 500,
          "currency": "EUR",
          "approved_amount": 500,
          "captured_amount": 0,
          "refunded_amount": 0,
          "created": "2026-12-01T01:00:01Z"
        }
      ]
    }
  ]
}
`
	if b.String() != want {
		t.Errorf("JSON:\n%s\nwant:\n%s", b.String(), want)
	}
}
