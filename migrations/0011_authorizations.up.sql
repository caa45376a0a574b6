-- Authorize now, capture later. A charge created with capture=false is an
-- authorization: it holds its amount on the account until it is captured
-- (in whole or in part), voided, or expires at expires_at.
--
-- accounts.held is the sum of the amounts of the account's charges in status
-- 'authorized', expired or not: every change to it locks the account row, so
-- it is exact under that lock. A hold whose expires_at has passed no longer
-- holds, whether or not the expiry sweep has yet written 'expired': readers
-- subtract only the live holds (status 'authorized' and expires_at in the
-- future), found through charges_holds. The sweep then writes the 'expired'
-- state and its event, and takes the hold out of held.
--
-- amount_captured is what the charge took from the balance: the whole amount
-- of a charge captured at once (every charge before this migration), the
-- captured part of an authorization, 0 otherwise. Refunds apply to it.
ALTER TABLE accounts ADD COLUMN held bigint NOT NULL DEFAULT 0 CHECK (held >= 0);

ALTER TABLE charges
    ADD COLUMN amount_captured bigint NOT NULL DEFAULT 0,
    ADD COLUMN expires_at timestamptz;

UPDATE charges SET amount_captured = amount WHERE status = 'succeeded';

ALTER TABLE charges
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check
        CHECK (status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired')),
    ADD CONSTRAINT charges_captured_check
        CHECK (amount_captured BETWEEN 0 AND amount AND (status = 'succeeded') = (amount_captured > 0)),
    ADD CONSTRAINT charges_refunded_check CHECK (amount_refunded <= amount_captured),
    ADD CONSTRAINT charges_expiry_check
        CHECK (status NOT IN ('authorized', 'voided', 'expired') OR expires_at IS NOT NULL);

-- The live holds of an account, and the sweep's next expiries: both only
-- over authorizations not yet captured, voided or swept.
CREATE INDEX charges_holds ON charges (merchant_id, account_id, expires_at) WHERE status = 'authorized';
CREATE INDEX charges_expiring ON charges (expires_at) WHERE status = 'authorized';
