DROP INDEX webhook_deliveries_by_age;
DROP INDEX webhook_attempts_by_age;
