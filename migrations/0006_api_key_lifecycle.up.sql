-- API keys get a public id (to list and revoke them by, never secret), the time
-- one was last used (updated at most once a minute, never per request) and the
-- time it was revoked. A revoked key stays listed and is refused.
ALTER TABLE api_keys
    ADD COLUMN id           text,
    ADD COLUMN last_used_at timestamptz,
    ADD COLUMN revoked_at   timestamptz;

UPDATE api_keys SET id = 'key_' || replace(gen_random_uuid()::text, '-', '');

ALTER TABLE api_keys
    ALTER COLUMN id SET NOT NULL,
    ADD CONSTRAINT api_keys_id_key UNIQUE (id),
    ADD CONSTRAINT api_keys_id_check CHECK (id ~ '^key_[0-9a-f]{32}$');

CREATE INDEX api_keys_merchant_id_idx ON api_keys (merchant_id, created_at);
