-- Charges' eleven CHECK constraints become one, which calls
-- payments_charge_rules: the same rules, checked in the same order, and a row
-- that breaks one is refused with the same error as before (SQLSTATE 23514,
-- the broken rule's constraint name).
--
-- Why: PostgreSQL keeps a table's CHECK constraints as stored expression trees
-- and reads and compiles them afresh for every statement that writes the
-- table (ExecRelCheck, once per statement and table). Charges' eleven come to
-- about 11 KB of stored tree, and reading them cost every charge batch about
-- 60 µs of the database's CPU, whatever its size: a tenth of a batch of one.
-- A PL/pgSQL function is compiled once per connection; the one CHECK that
-- calls it is a few hundred bytes. A row now costs one function call, which
-- a batch of sixteen pays for less than the trees it no longer reads
-- (docs/benchmarks.md, "Issue 47: what a batch costs the database").
--
-- The function checks the rules in the order PostgreSQL checked the
-- constraints (by name), so a row that breaks two is refused naming the same
-- one as before. A rule whose expression is NULL passes, as in a CHECK.
CREATE FUNCTION payments_charge_rules(
    status text, amount bigint, amount_captured bigint, amount_refunded bigint,
    failure_code text, account_id uuid, payment_method text, expires_at timestamptz)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN NOT (amount > 0) THEN 'charges_amount_check'
        WHEN NOT (amount_captured >= 0 AND amount_captured <= amount AND (status = 'succeeded') = (amount_captured > 0)) THEN 'charges_captured_check'
        WHEN NOT (payment_method IS NOT NULL OR status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired')) THEN 'charges_card_status_check'
        WHEN NOT (amount_refunded >= 0 AND amount_refunded <= amount) THEN 'charges_check'
        WHEN NOT ((status = 'failed') = (failure_code IS NOT NULL)) THEN 'charges_check1'
        WHEN NOT (status = 'succeeded' OR amount_refunded = 0) THEN 'charges_check2'
        WHEN NOT (account_id IS NULL OR status NOT IN ('authorized', 'voided', 'expired') OR expires_at IS NOT NULL) THEN 'charges_expiry_check'
        WHEN NOT ((account_id IS NULL) <> (payment_method IS NULL)) THEN 'charges_payer_check'
        WHEN NOT (payment_method ~ '^pm_[A-Za-z0-9_]{1,64}$') THEN 'charges_payment_method_check'
        WHEN NOT (amount_refunded <= amount_captured) THEN 'charges_refunded_check'
        WHEN NOT (status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired',
                             'processing', 'reversing', 'reversed', 'requires_review')) THEN 'charges_status_check'
    END;
    IF broken IS NOT NULL THEN
        RAISE check_violation USING
            MESSAGE = format('new row for relation "charges" violates check constraint "%s"', broken),
            TABLE = 'charges', CONSTRAINT = broken;
    END IF;
    RETURN true;
END $$;

ALTER TABLE charges
    ADD CONSTRAINT charges_rules CHECK (payments_charge_rules(
        status, amount, amount_captured, amount_refunded, failure_code, account_id, payment_method, expires_at)),
    DROP CONSTRAINT charges_amount_check,
    DROP CONSTRAINT charges_captured_check,
    DROP CONSTRAINT charges_card_status_check,
    DROP CONSTRAINT charges_check,
    DROP CONSTRAINT charges_check1,
    DROP CONSTRAINT charges_check2,
    DROP CONSTRAINT charges_expiry_check,
    DROP CONSTRAINT charges_payer_check,
    DROP CONSTRAINT charges_payment_method_check,
    DROP CONSTRAINT charges_refunded_check,
    DROP CONSTRAINT charges_status_check;
