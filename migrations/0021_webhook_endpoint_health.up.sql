-- What the Deliverer has learnt of each endpoint (internal/postgres/deliveries.go,
-- claimSQL and settleSQL), so that one that fails takes no more than it must
-- of the replicas' attempts, and one that keeps up gets more of them.
--
-- failures         the failed attempts in a row since the last 2xx: while
--                  above 0 the endpoint gets one attempt at a time, a probe,
--                  whatever its bound, so an endpoint that hangs holds one
--                  slot and not a slot per delivery due.
-- paused_until     no attempt before it: set after each failure, from the
--                  Deliverer's endpoint backoff, so the backlog of an
--                  endpoint that is down waits for the probe instead of
--                  being tried one delivery after the other.
-- in_flight_limit  how many of its deliveries may be in flight at once, across
--                  replicas: 4 at first, one more for each 2xx up to the
--                  Deliverer's bound, and back to 4 after a failure.
ALTER TABLE webhook_endpoints
    ADD COLUMN failures        integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    ADD COLUMN paused_until    timestamptz,
    ADD COLUMN in_flight_limit integer NOT NULL DEFAULT 4 CHECK (in_flight_limit >= 1);

-- The leased deliveries, which claims and fan-outs count per endpoint and
-- per merchant against those bounds, now with their lease's end: the count
-- of the unexpired ones (lease_until > now()) is then a range of this
-- index alone. Without the column, the planner of a new database (no
-- statistics yet) counted through webhook_deliveries_due, reading every
-- pending delivery of the merchant once per delivery a fan-out leased: 44 ms
-- of a 69 ms fan-out with 459 pending, under the bench's load.
DROP INDEX webhook_deliveries_leased;
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (merchant_id, endpoint_id, lease_until)
    WHERE state = 'pending' AND lease_until IS NOT NULL;

-- No foreign key from deliveries and attempts to their endpoint. Endpoints
-- are never deleted (deleted_at marks them), and only the fan-out, from a
-- live endpoint's row, and the record of a claimed delivery insert these
-- rows; the key's check cost every inserted row a FOR KEY SHARE lock on its
-- endpoint's row, which one endpoint's deliveries at the charge rate took
-- from the fan-out's and the records' transactions at once: a WAL record
-- each, and a multixact when two held it.
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_merchant_id_endpoint_id_fkey;
ALTER TABLE webhook_attempts DROP CONSTRAINT webhook_attempts_merchant_id_endpoint_id_fkey;
