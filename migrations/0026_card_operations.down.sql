-- Refuses while a capture, void or refund of a card charge is recorded: the
-- former schema has no way to say what it was.
DO $$
BEGIN
    IF EXISTS (SELECT FROM processor_operations WHERE kind <> 'authorize')
       OR EXISTS (SELECT FROM refunds WHERE account_id IS NULL) THEN
        RAISE EXCEPTION 'card charges have captures, voids or refunds, which the former schema cannot represent';
    END IF;
END $$;

DROP INDEX refunds_pending;
ALTER TABLE refunds
    DROP CONSTRAINT refunds_account_status_check,
    DROP COLUMN status,
    ALTER COLUMN account_id SET NOT NULL;
DROP INDEX processor_operations_settling;
ALTER TABLE processor_operations
    DROP CONSTRAINT processor_operations_kind_check,
    ADD CONSTRAINT processor_operations_kind_check CHECK (kind IN ('authorize'));
