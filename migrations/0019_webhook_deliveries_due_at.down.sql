DROP INDEX webhook_deliveries_due_at;
