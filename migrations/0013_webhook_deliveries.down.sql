-- Refuses while any delivery or attempt is recorded: the former schema has no
-- place for them, and dropping them would silently lose deliveries still due
-- and the merchants' record of attempts. An operator who means it deletes the
-- rows first.
DO $$
BEGIN
    IF EXISTS (SELECT FROM webhook_deliveries) OR EXISTS (SELECT FROM webhook_attempts) THEN
        RAISE EXCEPTION 'webhook_deliveries or webhook_attempts holds rows, which the former schema cannot represent; delete them first';
    END IF;
END $$;

DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
