-- A delivery can end without being made: 'canceled' when its endpoint is
-- deleted, or disabled by its merchant (internal/postgres/webhooks.go). Like
-- 'delivered' and 'abandoned' it is settled: never claimed (claims take
-- 'pending' only), its event no longer spared by pruning, and the record's
-- pruning deletes it once it is older than the retention. A resend makes it
-- pending again, with a new retry period.
--
-- One ALTER, so the rows are checked in one pass, under the table's exclusive
-- lock (the table holds EVENT_RETENTION's worth of deliveries).
ALTER TABLE webhook_deliveries
    DROP CONSTRAINT webhook_deliveries_state_check,
    ADD CONSTRAINT webhook_deliveries_state_check CHECK (state IN ('pending', 'delivered', 'abandoned', 'canceled'));

-- Endpoints deleted before this migration left their deliveries pending;
-- they end now, as a deletion ends them from here on.
UPDATE webhook_deliveries d SET state = 'canceled', lease_until = NULL, claim = NULL
FROM webhook_endpoints e
WHERE d.merchant_id = e.merchant_id AND d.endpoint_id = e.id
  AND d.state = 'pending' AND e.deleted_at IS NOT NULL;
