DROP TABLE idempotency_keys;
DROP TABLE charges;
DROP TABLE deposits;
DROP TABLE accounts;
DROP TABLE api_keys;
DROP TABLE merchants;
