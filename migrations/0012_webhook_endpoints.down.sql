-- Refuses while any endpoint is recorded, deleted ones included: the former
-- schema has no place for them, and dropping them would silently stop a
-- merchant's webhooks. An operator who means it deletes the rows first.
DO $$
BEGIN
    IF EXISTS (SELECT FROM webhook_endpoints) THEN
        RAISE EXCEPTION 'webhook_endpoints holds endpoints, which the former schema cannot represent; delete them first';
    END IF;
END $$;

DROP TABLE webhook_endpoints;
