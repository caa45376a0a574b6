-- Captures, voids and refunds of card charges go to the processor as
-- operations of their own (processor_operations.kind), each with its own id
-- (our reference for it; a refund's is the refund's), its own processor key
-- derived from that id and kind, and the psp reference of the charge's
-- authorization. For these kinds decision_deadline is when an outcome still
-- unknown goes to review (the processor's idempotency keys are not kept
-- forever, so a re-drive past it could do the operation twice).
ALTER TABLE processor_operations
    DROP CONSTRAINT processor_operations_kind_check,
    ADD CONSTRAINT processor_operations_kind_check CHECK (kind IN ('authorize', 'capture', 'void', 'refund'));

-- At most one capture or void of a charge in flight (or in review): the one
-- that ends decides what the charge is.
CREATE UNIQUE INDEX processor_operations_settling ON processor_operations (merchant_id, charge_id)
    WHERE kind IN ('capture', 'void') AND state IN ('processing', 'requires_review');

-- The refund of a card charge has no account, and is pending while the
-- processor's outcome is not known: its amount is reserved (the keyed write
-- that starts a refund counts the pending ones under the charge's row lock),
-- so refunds in flight never add up to more than was captured. It is then
-- succeeded (the charge's amount_refunded counts it) or failed (the
-- processor refused it: nothing moved). An account's refund is succeeded at
-- once, as before.
ALTER TABLE refunds
    ALTER COLUMN account_id DROP NOT NULL,
    ADD COLUMN status text NOT NULL DEFAULT 'succeeded' CHECK (status IN ('pending', 'succeeded', 'failed')),
    ADD CONSTRAINT refunds_account_status_check CHECK (account_id IS NULL OR status = 'succeeded');

-- The pending refunds of a charge, counted by the keyed write of every
-- refund of it.
CREATE INDEX refunds_pending ON refunds (merchant_id, charge_id) WHERE status = 'pending';
