package httpapi_test

// The plain-Go model TestAuthorizeProperty checks the service against: the
// accounts' balances and every charge's state, changed by the rules of
// charging, authorizing, capturing, voiding, refunding and expiring and
// nothing else. It knows no HTTP and no SQL.

// modelCharge is a charge as the model sees it.
type modelCharge struct {
	id, acct           string
	amount             int64
	authorization      bool   // created with capture: false
	status             string // succeeded, failed, authorized, voided, expired
	captured, refunded int64
	swept              bool // its expiry is written, with its event
}

// model is one merchant's money.
type model struct {
	balance map[string]int64 // by account id
	charges map[string]*modelCharge
	order   []string // charge ids, oldest first
	refunds int
}

func newModel() *model {
	return &model{balance: map[string]int64{}, charges: map[string]*modelCharge{}}
}

// available is the balance less the live holds.
func (m *model) available(acct string) int64 {
	n := m.balance[acct]
	for _, c := range m.charges {
		if c.acct == acct && c.status == "authorized" {
			n -= c.amount
		}
	}
	return n
}

// outcome is what the service must answer: a status, and for a refusal its
// problem code and charge_status.
type outcome struct {
	status       int
	code         string
	chargeStatus string
}

// create decides a charge (capture) or an authorization of amount on acct,
// and records it under id once the service has named it.
func (m *model) create(acct string, amount int64, capture bool) (outcome, func(id string) *modelCharge) {
	c := &modelCharge{acct: acct, amount: amount, authorization: !capture, status: "failed"}
	o := outcome{status: 402, code: "insufficient-funds"}
	if amount <= m.available(acct) {
		o = outcome{status: 201}
		c.status = "authorized"
		if capture {
			c.status, c.captured = "succeeded", amount
			m.balance[acct] -= amount
		}
	}
	return o, func(id string) *modelCharge {
		c.id = id
		m.charges[id] = c
		m.order = append(m.order, id)
		return c
	}
}

// capture decides a capture of n (0: the whole authorization) of c.
func (m *model) capture(c *modelCharge, n int64) outcome {
	if n == 0 {
		n = c.amount
	}
	switch {
	case c.status != "authorized":
		return outcome{409, "charge-not-capturable", c.status}
	case n > c.amount:
		return outcome{422, "capture-exceeds-authorization", ""}
	}
	c.status, c.captured = "succeeded", n
	m.balance[c.acct] -= n
	return outcome{status: 200}
}

// void decides a void of c.
func (m *model) void(c *modelCharge) outcome {
	if c.status != "authorized" {
		return outcome{409, "charge-not-voidable", c.status}
	}
	c.status = "voided"
	return outcome{status: 200}
}

// refund decides a refund of n (0: what is left of the captured amount) of
// c, and returns the amount refunded.
func (m *model) refund(c *modelCharge, n int64) (outcome, int64) {
	if n == 0 {
		n = c.captured - c.refunded
	}
	switch {
	case c.status != "succeeded":
		return outcome{409, "charge-not-refundable", ""}, 0
	case n <= 0 || c.refunded+n > c.captured:
		return outcome{422, "refund-exceeds-charge", ""}, 0
	}
	c.refunded += n
	m.balance[c.acct] += n
	m.refunds++
	return outcome{status: 201}, n
}

// expire passes c's expires_at: an authorization is expired from then on.
func (m *model) expire(c *modelCharge) {
	if c.status == "authorized" {
		c.status = "expired"
	}
}

// sweep records the expiries not yet written and returns how many.
func (m *model) sweep() int64 {
	var n int64
	for _, c := range m.charges {
		if c.status == "expired" && !c.swept {
			c.swept = true
			n++
		}
	}
	return n
}

// events is what the feed holds about c: one event per transition.
func (c *modelCharge) events() map[string]int {
	switch {
	case c.status == "failed":
		return map[string]int{"charge.failed": 1}
	case !c.authorization:
		return map[string]int{"charge.succeeded": 1}
	}
	e := map[string]int{"charge.authorized": 1}
	switch {
	case c.status == "succeeded":
		e["charge.captured"] = 1
	case c.status == "voided":
		e["charge.voided"] = 1
	case c.status == "expired" && c.swept:
		e["charge.expired"] = 1
	}
	return e
}
