DROP INDEX webhook_deliveries_leased;
