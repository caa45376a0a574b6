-- Without revoked_at a revoked key would be valid again: delete those first.
DELETE FROM api_keys WHERE revoked_at IS NOT NULL;
DROP INDEX api_keys_merchant_id_idx;
ALTER TABLE api_keys
    DROP COLUMN id,
    DROP COLUMN last_used_at,
    DROP COLUMN revoked_at;
