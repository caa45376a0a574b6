-- The leased deliveries of an endpoint (lease_until set), which a claim
-- counts against the endpoint's bound of attempts in flight
-- (internal/postgres/deliveries.go, claimSQL). Counted through
-- webhook_deliveries_due instead, that count read every pending delivery of
-- the endpoint: 9.5 ms a claim with 50,000 pending, where an endpoint back
-- from an outage has its backlog, so a claim cost grew with the backlog it
-- was to work off. Leased rows are at most the bound per endpoint, plus the
-- expired leases of crashed workers until they are claimed again.
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (merchant_id, endpoint_id)
    WHERE state = 'pending' AND lease_until IS NOT NULL;
