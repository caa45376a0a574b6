package procsim

import "sort"

// Outcome is what the simulator decides for an authorization.
type Outcome string

// The outcomes of an authorization.
const (
	OutcomeApprove Outcome = "approve"
	OutcomeDecline Outcome = "decline"
	OutcomePending Outcome = "pending"
)

// Fault is what goes wrong around one request, besides its outcome.
type Fault int

// The faults. FaultNone answers at once; every other one is described on the
// test payment method that causes it.
const (
	FaultNone         Fault = iota
	FaultLoseResponse       // process, commit, then drop the connection unanswered
	FaultAnswerLate         // process, commit, answer after Config.LateDelay
	Fault5xxBefore          // answer 500 without processing anything
	Fault5xxAfter           // process, commit, answer 500
	FaultSlow               // process, commit, answer after Config.SlowDelay
)

// Method is a test payment method: the outcome of an authorization made with
// it, the fault around that authorization, and how its reversals behave.
type Method struct {
	Name        string
	Outcome     Outcome
	DeclineCode string // for OutcomeDecline
	Fault       Fault
	// ReversalRefusals is how many reversals of a payment made with it are
	// refused (503) before one is accepted.
	ReversalRefusals int
	Doc              string
}

// methods are the test payment methods, by name: docs/processors.md lists them.
var methods = map[string]Method{
	"pm_card_approve": {Outcome: OutcomeApprove,
		Doc: "approved at once"},
	"pm_card_decline_insufficient_funds": {Outcome: OutcomeDecline, DeclineCode: "insufficient_funds",
		Doc: "declined (402) with code `insufficient_funds`"},
	"pm_card_decline_do_not_honor": {Outcome: OutcomeDecline, DeclineCode: "do_not_honor",
		Doc: "declined (402) with code `do_not_honor`"},
	"pm_card_approve_lose_response": {Outcome: OutcomeApprove, Fault: FaultLoseResponse,
		Doc: "approved and committed, then the connection is closed without an answer"},
	"pm_card_approve_answer_late": {Outcome: OutcomeApprove, Fault: FaultAnswerLate,
		Doc: "approved and committed, answered after `-late-delay` (longer than a caller's timeout)"},
	"pm_card_5xx_before": {Outcome: OutcomeApprove, Fault: Fault5xxBefore,
		Doc: "500 on every attempt; nothing is processed or stored"},
	"pm_card_5xx_after": {Outcome: OutcomeApprove, Fault: Fault5xxAfter,
		Doc: "approved and committed, answered 500; a same-key retry replays the approval"},
	"pm_card_slow": {Outcome: OutcomeApprove, Fault: FaultSlow,
		Doc: "approved, answered after `-slow-delay` (within a caller's timeout)"},
	"pm_card_async_pending": {Outcome: OutcomePending,
		Doc: "answered 202 `pending`; approved after `-async-delay`, announced by a signed webhook"},
	"pm_card_reversal_refused_3": {Outcome: OutcomeApprove, ReversalRefusals: 3,
		Doc: "approved; its reversal is refused (503) 3 times, then accepted"},
}

func init() {
	for name, m := range methods {
		m.Name = name
		methods[name] = m
	}
}

// LookupMethod returns the test payment method called name, and whether
// there is one.
func LookupMethod(name string) (Method, bool) {
	m, ok := methods[name]
	return m, ok
}

// Methods returns every test payment method, sorted by name.
func Methods() []Method {
	out := make([]Method, 0, len(methods))
	for _, m := range methods {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
