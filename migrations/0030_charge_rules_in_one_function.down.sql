-- Back to the eleven CHECK constraints of 0029, under their names.
ALTER TABLE charges
    ADD CONSTRAINT charges_amount_check CHECK (amount > 0),
    ADD CONSTRAINT charges_captured_check
        CHECK (amount_captured >= 0 AND amount_captured <= amount AND (status = 'succeeded') = (amount_captured > 0)),
    ADD CONSTRAINT charges_card_status_check
        CHECK (payment_method IS NOT NULL OR status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired')),
    ADD CONSTRAINT charges_check CHECK (amount_refunded >= 0 AND amount_refunded <= amount),
    ADD CONSTRAINT charges_check1 CHECK ((status = 'failed') = (failure_code IS NOT NULL)),
    ADD CONSTRAINT charges_check2 CHECK (status = 'succeeded' OR amount_refunded = 0),
    ADD CONSTRAINT charges_expiry_check
        CHECK (account_id IS NULL OR status NOT IN ('authorized', 'voided', 'expired') OR expires_at IS NOT NULL),
    ADD CONSTRAINT charges_payer_check CHECK ((account_id IS NULL) <> (payment_method IS NULL)),
    ADD CONSTRAINT charges_payment_method_check CHECK (payment_method ~ '^pm_[A-Za-z0-9_]{1,64}$'),
    ADD CONSTRAINT charges_refunded_check CHECK (amount_refunded <= amount_captured),
    ADD CONSTRAINT charges_status_check
        CHECK (status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired',
                          'processing', 'reversing', 'reversed', 'requires_review')),
    DROP CONSTRAINT charges_rules;
DROP FUNCTION payments_charge_rules(text, bigint, bigint, bigint, text, uuid, text, timestamptz);
