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
