package postgres

// The SQL of card charges (cards.go). The lock order is the service's
// (internal/charging/charging.go): a key's advisory lock, then the
// operation, its charge, and the key's row.

const (
	insertCardChargeSQL = `
INSERT INTO charges (merchant_id, id, payment_method, amount, currency, status, description, metadata)
VALUES ($1, $2, $3, $4, $5, 'processing', $6, $7)
RETURNING created_at`

	// insertOperationSQL inserts the operation, its deadlines counted from
	// the transaction's clock, and the charge's event.
	insertOperationSQL = `
WITH op AS (
    INSERT INTO processor_operations (merchant_id, id, charge_id, kind, state, processor, processor_key, amount,
                                      currency, payment_method, capture, decision_deadline, next_check_at)
    VALUES (@merchant, @id, @charge, @kind, 'processing', @processor, @key, @amount,
            @currency, @payment_method, @capture, now() + @decision_after::interval, now() + @check_after::interval)
)
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES (@merchant, @event_id, 'charge', @charge, @event_type, @payload)`

	// operationColumns are an operation's, for scanOperation, followed by
	// its charge's (chargeColumns) through operationCharge.
	operationColumns = `o.merchant_id, o.id, o.charge_id, o.kind, o.state, coalesce(o.processor, ''), o.processor_key, o.amount, o.currency,
       o.payment_method, o.capture, coalesce(o.psp_reference, ''), o.decision_deadline, o.next_check_at, o.attempts,
       o.reversal_attempts, o.reversal_round, coalesce(o.last_code, ''), o.created_at, ch.*`

	operationCharge = `
CROSS JOIN LATERAL (SELECT ` + chargeColumns + ` FROM charges WHERE merchant_id = o.merchant_id AND id = o.charge_id) ch`

	operationSQL = `SELECT ` + operationColumns + ` FROM processor_operations o ` + operationCharge + `
WHERE o.merchant_id = $1 AND o.id = $2`

	// operationByReferenceSQL finds an operation by our reference alone, as a
	// processor's webhook names it (an id is unique across merchants).
	operationByReferenceSQL = `SELECT ` + operationColumns + ` FROM processor_operations o ` + operationCharge + `
WHERE o.id = $1 LIMIT 1`

	// claimOperationsSQL leases the due operations of processor $3 (and
	// those made before operations named their processor), oldest due
	// first, skipping those another claim holds.
	claimOperationsSQL = `
WITH due AS (
    SELECT merchant_id, id FROM processor_operations
    WHERE next_check_at <= now() AND (processor = $3 OR processor IS NULL)
    ORDER BY next_check_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE processor_operations o SET next_check_at = now() + $1::interval
    FROM due WHERE o.merchant_id = due.merchant_id AND o.id = due.id
    RETURNING o.*
)
SELECT ` + operationColumns + ` FROM leased o ` + operationCharge

	// lockOperationKeySQL takes the advisory lock of the key bound to the
	// operation, as claimKeySQL does, before the transition writes its row.
	lockOperationKeySQL = `
SELECT pg_advisory_xact_lock(hashtextextended(merchant_id::text || key, 0))
FROM idempotency_keys WHERE merchant_id = $1 AND operation_id = $2`

	// transitionSQL is a compare-and-set on the operation's state: the
	// operation, its charge, the event and the key's response are written
	// only if the operation is still in @from (and its processor's event,
	// if any, was not recorded before). It returns whether it was, when the
	// response was stored (NULL: not, the key had one), and whether the
	// event was new.
	transitionSQL = `
WITH inbound AS (
    INSERT INTO processor_events (merchant_id, id, operation_id, type)
    SELECT @merchant::uuid, @inbound_id::text, @id::uuid, @inbound_type::text WHERE @inbound_id::text <> ''
    ON CONFLICT DO NOTHING
    RETURNING 1
), op AS (
    UPDATE processor_operations
    SET state = @to, psp_reference = coalesce(nullif(@psp::text, ''), psp_reference),
        next_check_at = CASE WHEN @to::text IN ('processing', 'reversing') THEN now() + @check_after::interval END,
        attempts = @attempts, reversal_attempts = @reversal_attempts, reversal_round = @reversal_round,
        last_code = nullif(@last_code::text, ''),
        resolved_at = CASE WHEN @to::text NOT IN ('processing', 'reversing') THEN clock_timestamp() END
    WHERE merchant_id = @merchant AND id = @id AND state = @from
      AND (@inbound_id::text = '' OR EXISTS (SELECT FROM inbound))
    RETURNING charge_id
), charge AS (
    UPDATE charges
    SET status = @status, failure_code = nullif(@failure_code::text, ''), decline_code = nullif(@decline_code::text, ''),
        amount_captured = @amount_captured, psp_reference = coalesce(nullif(@psp::text, ''), psp_reference)
    WHERE merchant_id = @merchant AND id = (SELECT charge_id FROM op)
), event AS (
    INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
    SELECT @merchant::uuid, @event_id::uuid, 'charge', charge_id, @event_type::text, @payload::jsonb
    FROM op WHERE @event_type::text <> ''
), answer AS (
    UPDATE idempotency_keys
    SET status = @answer_status::smallint, location = nullif(@answer_location::text, ''), body = @answer_body::bytea,
        body_encoding = @answer_encoding::text, created_at = clock_timestamp()
    WHERE merchant_id = @merchant AND operation_id = @id AND status IS NULL
      AND @answer_status::smallint > 0 AND EXISTS (SELECT FROM op)
    RETURNING created_at
)
SELECT (SELECT count(*) FROM op), (SELECT created_at FROM answer), (SELECT count(*) FROM inbound)`

	// insertResolutionSQL writes the audit row of an operator's settlement,
	// after the transition it brought (same transaction): its time is the
	// operation's resolved_at, which that transition has just set.
	insertResolutionSQL = `
INSERT INTO charge_resolutions (merchant_id, id, charge_id, from_state, resolved_as, status, reason, operator, resolved_at)
SELECT merchant_id, @resolution_id, charge_id, @from, @as, @status, @reason, @operator, resolved_at
FROM processor_operations WHERE merchant_id = @merchant AND id = @id`

	// operationStatusSQL reads the key bound to the operation and the
	// charge.
	operationStatusSQL = `
SELECT k.status, coalesce(k.location, ''), k.body, k.body_encoding, k.created_at, ch.*
FROM processor_operations o ` + operationCharge + `
LEFT JOIN idempotency_keys k ON k.merchant_id = o.merchant_id AND k.operation_id = o.id
WHERE o.merchant_id = $1 AND o.id = $2`

	recordProcessorEventSQL = `
INSERT INTO processor_events (merchant_id, id, operation_id, type) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING`

	openOperationsSQL = `
SELECT count(*) FILTER (WHERE state IN ('processing', 'reversing')),
       count(*) FILTER (WHERE state = 'requires_review'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE state IN ('processing', 'reversing'))), 0)::float8
FROM processor_operations
WHERE next_check_at IS NOT NULL OR state = 'requires_review'`
)
