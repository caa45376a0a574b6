-- The pending deliveries in the order they come due, across endpoints: the
-- metrics' sampler (internal/postgres/monitor.go, dueSQL) counts those due
-- now, up to a bound, and reads how long the most overdue has waited. Without
-- it, that sample read every pending delivery through webhook_deliveries_due,
-- whose first columns are the endpoint's: 60-80 ms with 300,000 pending on
-- 15,000 endpoints, 125,000 of them due, every retry a failing endpoint has
-- scheduled for later read as well. With it, the sample reads the due ones in
-- order up to the bound: 10,661 entries, 10-30 ms. Building it reads the
-- table once and holds off writes to it meanwhile.
CREATE INDEX webhook_deliveries_due_at ON webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';
