-- Refuses while a card charge is recorded: the former schema has no way to
-- say what it was.
DO $$
BEGIN
    IF EXISTS (SELECT FROM charges WHERE payment_method IS NOT NULL) THEN
        RAISE EXCEPTION 'charges hold card charges, which the former schema cannot represent';
    END IF;
END $$;

DROP TABLE processor_events;
DROP TABLE processor_operations;
ALTER TABLE charges
    DROP CONSTRAINT charges_expiry_check,
    ADD CONSTRAINT charges_expiry_check
        CHECK (status NOT IN ('authorized', 'voided', 'expired') OR expires_at IS NOT NULL),
    DROP CONSTRAINT charges_card_status_check,
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check
        CHECK (status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired')),
    DROP CONSTRAINT charges_payer_check,
    DROP COLUMN decline_code,
    DROP COLUMN psp_reference,
    DROP COLUMN payment_method,
    ALTER COLUMN account_id SET NOT NULL;
