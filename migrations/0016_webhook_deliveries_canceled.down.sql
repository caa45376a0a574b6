-- The former schema has no 'canceled': a canceled delivery becomes
-- 'abandoned', the other state in which a delivery ends without being made.
-- Never 'pending': an endpoint enabled again after its deliveries were
-- canceled would then be sent events its merchant had stopped.
UPDATE webhook_deliveries SET state = 'abandoned' WHERE state = 'canceled';
ALTER TABLE webhook_deliveries
    DROP CONSTRAINT webhook_deliveries_state_check,
    ADD CONSTRAINT webhook_deliveries_state_check CHECK (state IN ('pending', 'delivered', 'abandoned'));
