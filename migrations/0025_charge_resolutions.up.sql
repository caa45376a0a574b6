-- The audit of operators' settlements of card charges in review (payments
-- charges resolve): one row per resolution, written in the transaction of
-- the charge's transition out of requires_review, so a charge is never
-- settled without its row, nor a row written for a settlement that lost.
-- Rows are never updated.
--
-- resolved_as is what the operator said the processor did (succeeded: it
-- kept the money; failed: it did not); status is what the charge became
-- (succeeded, or authorized for a charge created with capture false; or
-- failed). resolved_at is the operation's resolved_at, the transaction's
-- one clock. A charge may be resolved more than once only if it went back
-- to review in between (an approval after it failed is reversed again), so
-- nothing makes charge_id unique.
CREATE TABLE charge_resolutions (
    merchant_id uuid        NOT NULL,
    id          uuid        NOT NULL,
    charge_id   uuid        NOT NULL,
    from_state  text        NOT NULL CHECK (from_state = 'requires_review'),
    resolved_as text        NOT NULL CHECK (resolved_as IN ('succeeded', 'failed')),
    status      text        NOT NULL CHECK (status IN ('succeeded', 'authorized', 'failed')),
    reason      text        NOT NULL CHECK (char_length(btrim(reason)) BETWEEN 1 AND 500),
    operator    text        NOT NULL CHECK (char_length(btrim(operator)) BETWEEN 1 AND 100),
    resolved_at timestamptz NOT NULL,
    PRIMARY KEY (merchant_id, id),
    FOREIGN KEY (merchant_id, charge_id) REFERENCES charges (merchant_id, id),
    CHECK ((resolved_as = 'failed') = (status = 'failed'))
);

-- A charge's resolutions, in order.
CREATE INDEX charge_resolutions_charge ON charge_resolutions (merchant_id, charge_id, resolved_at);
