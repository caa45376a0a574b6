ALTER TABLE webhook_attempts ADD CONSTRAINT webhook_attempts_merchant_id_endpoint_id_fkey
    FOREIGN KEY (merchant_id, endpoint_id) REFERENCES webhook_endpoints (merchant_id, id);
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_merchant_id_endpoint_id_fkey
    FOREIGN KEY (merchant_id, endpoint_id) REFERENCES webhook_endpoints (merchant_id, id);
DROP INDEX webhook_deliveries_leased;
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (merchant_id, endpoint_id)
    WHERE state = 'pending' AND lease_until IS NOT NULL;
ALTER TABLE webhook_endpoints
    DROP COLUMN failures,
    DROP COLUMN paused_until,
    DROP COLUMN in_flight_limit;
