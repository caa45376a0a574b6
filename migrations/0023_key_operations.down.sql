DROP INDEX idempotency_keys_operation;
-- A key still bound to an operation has no response, which the former schema
-- cannot answer from: it is deleted, as if its request had never come.
DELETE FROM idempotency_keys WHERE status IS NULL;
ALTER TABLE idempotency_keys DROP COLUMN operation_id;
