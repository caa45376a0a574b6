package consumer

import (
	"testing"

	"github.com/google/uuid"
)

// TestEffectWithoutAccount: webhook_endpoint.disabled is accepted with no
// account and no balance effect; every other type must still name an
// account.
func TestEffectWithoutAccount(t *testing.T) {
	merchant := uuid.NewString()
	const event = `"id":"evt_0193a1b2c3d47e8f9a0b1c2d3e4f5a6b"`
	e, err := Effect(merchant, []byte(`{`+event+`,"type":"webhook_endpoint.disabled",
		"data":{"id":"we_7c1f0b6e2d9a4c55b0e3f4a1d2c3b4a5","object":"webhook_endpoint","status":"disabled"}}`))
	if err != nil || e.AccountID != uuid.Nil || e.Delta != 0 {
		t.Errorf("webhook_endpoint.disabled: %+v, %v; want no account and no delta", e, err)
	}
	for _, eventType := range []string{"account.created", "deposit.created", "charge.failed"} {
		if _, err := Effect(merchant, []byte(`{`+event+`,"type":"`+eventType+`","data":{"id":"x"}}`)); err == nil {
			t.Errorf("%s without an account id accepted", eventType)
		}
	}
}

// TestCardEventsTouchNoBalance: the events of a charge at a card processor
// (its payload has a payment_method, no account) and of its refunds (a
// status, no account) move no account's balance: they are recorded, not
// refused. The consumer terminated them at ERROR as unreadable ("unknown
// event type charge.processing", "charge.failed event without an account
// id") as soon as a deployment charged cards. The card-only types still need
// a payment method.
func TestCardEventsTouchNoBalance(t *testing.T) {
	merchant := uuid.NewString()
	const event = `"id":"evt_0193a1b2c3d47e8f9a0b1c2d3e4f5a6b"`
	card := `"data":{"id":"ch_0193a1b2c3d47e8f9a0b1c2d3e4f5a6c","object":"charge","payment_method":"pm_card_approve","amount":1200,"amount_captured":1200}`
	for _, eventType := range []string{"charge.processing", "charge.succeeded", "charge.authorized", "charge.captured",
		"charge.voided", "charge.failed", "charge.reversing", "charge.reversed", "charge.requires_review"} {
		e, err := Effect(merchant, []byte(`{`+event+`,"type":"`+eventType+`",`+card+`}`))
		if err != nil || e.AccountID != uuid.Nil || e.Delta != 0 {
			t.Errorf("%s of a card charge: %+v, %v; want recorded, no account, no delta", eventType, e, err)
		}
	}
	refund := `"data":{"id":"re_0193a1b2c3d47e8f9a0b1c2d3e4f5a6d","object":"refund","charge_id":"ch_0193a1b2c3d47e8f9a0b1c2d3e4f5a6c","amount":300,"status":"succeeded"}`
	if e, err := Effect(merchant, []byte(`{`+event+`,"type":"refund.created",`+refund+`}`)); err != nil || e.AccountID != uuid.Nil || e.Delta != 0 {
		t.Errorf("a card refund: %+v, %v; want recorded, no account, no delta", e, err)
	}
	if _, err := Effect(merchant, []byte(`{`+event+`,"type":"charge.processing","data":{"id":"x"}}`)); err == nil {
		t.Error("charge.processing without a payment method accepted")
	}
}
