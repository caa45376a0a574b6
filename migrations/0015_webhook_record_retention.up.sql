-- The webhook record is kept as long as the events are (EVENT_RETENTION):
-- the Deliverer deletes attempts and deliveries older than it, oldest first
-- and in batches (internal/postgres/webhookprune.go). These indexes let it
-- find the oldest without reading the tables.
CREATE INDEX webhook_attempts_by_age ON webhook_attempts (attempted_at);
CREATE INDEX webhook_deliveries_by_age ON webhook_deliveries (created_at);
