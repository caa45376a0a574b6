DROP INDEX processor_operations_created;
DROP TABLE reconciliation_runs;
