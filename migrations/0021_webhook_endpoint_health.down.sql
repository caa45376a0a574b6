ALTER TABLE webhook_endpoints
    DROP COLUMN failures,
    DROP COLUMN paused_until,
    DROP COLUMN in_flight_limit;
