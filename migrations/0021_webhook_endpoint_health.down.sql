DROP INDEX webhook_deliveries_leased;
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (merchant_id, endpoint_id)
    WHERE state = 'pending' AND lease_until IS NOT NULL;
ALTER TABLE webhook_endpoints
    DROP COLUMN failures,
    DROP COLUMN paused_until,
    DROP COLUMN in_flight_limit;
