-- Refuses while an authorization, a void or an expiry is recorded: the
-- former schema has no way to say what they were.
DO $$
BEGIN
    IF EXISTS (SELECT FROM charges WHERE status IN ('authorized', 'voided', 'expired'))
       OR EXISTS (SELECT FROM charges WHERE status = 'succeeded' AND amount_captured <> amount) THEN
        RAISE EXCEPTION 'charges hold authorizations or partial captures, which the former schema cannot represent';
    END IF;
END $$;

DROP INDEX charges_expiring;
DROP INDEX charges_holds;
ALTER TABLE charges
    DROP CONSTRAINT charges_expiry_check,
    DROP CONSTRAINT charges_refunded_check,
    DROP CONSTRAINT charges_captured_check,
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check CHECK (status IN ('succeeded', 'failed')),
    DROP COLUMN expires_at,
    DROP COLUMN amount_captured;
ALTER TABLE accounts DROP COLUMN held;
