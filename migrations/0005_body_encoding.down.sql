ALTER TABLE idempotency_keys DROP COLUMN body_encoding;
