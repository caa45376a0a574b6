-- The former spelling, for the code before migration 0010.
UPDATE charges SET failure_code = 'insufficient_funds' WHERE failure_code = 'insufficient-funds';
