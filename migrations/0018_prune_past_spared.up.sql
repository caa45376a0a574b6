-- Pruning the webhook record (internal/postgres/webhookprune.go) no longer
-- reads the deliveries by age alone (migration 0015), where a batch of the
-- oldest could be made only of deliveries it keeps (pending to a live
-- endpoint) and stop it. The settled ones, which all go once old, have an
-- index of their own; the pending ones are walked in passes that start each
-- batch where the last one ended, which needs every delivery's own place in
-- the order: one fan-out creates many with the same created_at, so the
-- primary key follows it. Pending deliveries are few (those in flight or
-- retried), so the wide index stays small.
DROP INDEX webhook_deliveries_by_age;
CREATE INDEX webhook_deliveries_settled_by_age ON webhook_deliveries (created_at) WHERE state <> 'pending';
CREATE INDEX webhook_deliveries_pending_by_age ON webhook_deliveries (created_at, merchant_id, endpoint_id, event_id)
    WHERE state = 'pending';
