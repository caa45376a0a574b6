package processor_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestSimulatorPayments lists the simulator's payments by creation time
// through the Records port: more than a page of them, every one once, oldest
// first, with its reference, status, amounts and creation time; a range
// that holds none is empty; the simulator gone is ErrUnknown.
func TestSimulatorPayments(t *testing.T) {
	t.Parallel()
	sim := procsimtest.Start(t)
	p := newAdapter(sim, 5*time.Second)
	ctx := t.Context()
	since := time.Now().Add(-time.Second)
	const n = 130 // more than a page (100)
	for i := range n {
		method := "pm_card_approve"
		if i%10 == 3 {
			method = "pm_card_decline_insufficient_funds"
		}
		a := authorization(fmt.Sprintf("ref_rec_%03d", i), method, i%2 == 0)
		a.Amount = int64(1000 + i)
		p.Authorize(ctx, a)
	}
	until := time.Now().Add(time.Second)
	got, err := p.Payments(ctx, since, until)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("listed %d payments, want %d", len(got), n)
	}
	for i, pay := range got {
		wantStatus, approved := "captured", int64(1000+i)
		switch {
		case i%10 == 3:
			wantStatus, approved = "declined", 0
		case i%2 == 1:
			wantStatus = "authorized"
		}
		if pay.Reference != fmt.Sprintf("ref_rec_%03d", i) || pay.Status != wantStatus || pay.Amount != int64(1000+i) ||
			pay.ApprovedAmount != approved || pay.Currency != "EUR" || pay.PSPReference == "" {
			t.Errorf("payment %d: %+v, want %s %s approved %d", i, pay, fmt.Sprintf("ref_rec_%03d", i), wantStatus, approved)
		}
		if pay.Created.Before(since) || !pay.Created.Before(until) || (i > 0 && pay.Created.Before(got[i-1].Created)) {
			t.Errorf("payment %d created %v, not in order within [%v, %v)", i, pay.Created, since, until)
		}
	}
	if none, err := p.Payments(ctx, until, until.Add(time.Hour)); err != nil || len(none) != 0 {
		t.Errorf("a range with none: %v, %v", none, err)
	}
	sim.Kill()
	p.Attempts = 1
	if _, err := p.Payments(ctx, since, until); !errors.Is(err, processor.ErrUnknown) {
		t.Errorf("with the simulator gone: %v, want ErrUnknown", err)
	}
}
