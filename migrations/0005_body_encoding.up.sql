-- Stored response bodies over 1 KiB may be kept zstd-compressed (where that
-- saves space); NULL means the body is stored as is.
ALTER TABLE idempotency_keys
    ADD COLUMN body_encoding text CHECK (body_encoding IN ('zstd'));
