DROP INDEX webhook_deliveries_pending_by_age;
DROP INDEX webhook_deliveries_settled_by_age;
CREATE INDEX webhook_deliveries_by_age ON webhook_deliveries (created_at);
