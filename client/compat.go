package client

// The generated id types' spellings before 1.2.0, when the generator did not
// write Go's initialisms (AccountId for AccountID). They are aliases, so code
// that names them builds and means the same type; struct fields cannot be
// aliased, so Charge.Id and its kind are now Charge.ID (CHANGELOG.md).
//
//nolint:revive // var-naming: these are the former, un-Go spellings, kept on purpose
type (
	// AccountId is AccountID's former spelling.
	//
	// Deprecated: use AccountID.
	AccountId = AccountID
	// AccountIdPath is AccountIDPath's former spelling.
	//
	// Deprecated: use AccountIDPath.
	AccountIdPath = AccountIDPath
	// ChargeId is ChargeID's former spelling.
	//
	// Deprecated: use ChargeID.
	ChargeId = ChargeID
	// ChargeIdPath is ChargeIDPath's former spelling.
	//
	// Deprecated: use ChargeIDPath.
	ChargeIdPath = ChargeIDPath
	// DepositId is DepositID's former spelling.
	//
	// Deprecated: use DepositID.
	DepositId = DepositID
	// DepositIdPath is DepositIDPath's former spelling.
	//
	// Deprecated: use DepositIDPath.
	DepositIdPath = DepositIDPath
	// EventId is EventID's former spelling.
	//
	// Deprecated: use EventID.
	EventId = EventID
	// RefundId is RefundID's former spelling.
	//
	// Deprecated: use RefundID.
	RefundId = RefundID
	// RefundIdPath is RefundIDPath's former spelling.
	//
	// Deprecated: use RefundIDPath.
	RefundIdPath = RefundIDPath
	// RequestId is RequestID's former spelling.
	//
	// Deprecated: use RequestID.
	RequestId = RequestID
	// WebhookAttemptId is WebhookAttemptID's former spelling.
	//
	// Deprecated: use WebhookAttemptID.
	WebhookAttemptId = WebhookAttemptID
	// WebhookEndpointId is WebhookEndpointID's former spelling.
	//
	// Deprecated: use WebhookEndpointID.
	WebhookEndpointId = WebhookEndpointID
	// WebhookEndpointIdPath is WebhookEndpointIDPath's former spelling.
	//
	// Deprecated: use WebhookEndpointIDPath.
	WebhookEndpointIdPath = WebhookEndpointIDPath
)

// TooManyUnknownKeys is TooManyRequests's name before the spec's 429 answer
// also meant rate-limited.
//
// Deprecated: use TooManyRequests.
type TooManyUnknownKeys = TooManyRequests
