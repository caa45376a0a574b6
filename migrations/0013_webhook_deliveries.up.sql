-- Webhook deliveries and the record of their attempts (docs/webhooks.md).
-- The fan-out (internal/postgres/deliveries.go) inserts a delivery per event
-- an endpoint subscribes to, in the transaction that moves the endpoint's
-- cursor (migration 0012); workers on every replica claim due deliveries
-- under a lease, POST them, and record each attempt in the transaction that
-- settles the delivery. No foreign key to events: pruning deletes events in
-- batches and must not fail on one row; it spares the events that pending
-- deliveries still need instead (outbox.go, pruneSQL).
--
-- merchant_id,     the delivery's endpoint (migration 0012), keyed by its
-- endpoint_id      merchant first, as every key (migration 0001).
-- event_id         the event delivered, one of the merchant's; its body is
--                  read from events at each attempt.
-- state            'pending' until a 2xx answers it ('delivered'), or until
--                  it has failed for the whole retry period ('abandoned',
--                  and the endpoint is disabled); a disabled or deleted
--                  endpoint's pending deliveries are never claimed again.
-- attempts         how many attempts were recorded.
-- next_attempt_at  when it is due: the fan-out's time, then the last failed
--                  attempt's time plus the backoff the worker drew.
-- first_attempt_at when its first attempt was recorded; the retry period
--                  counts from it. NULL before the first attempt.
-- lease_until,     a worker's claim: until lease_until no other worker claims
-- claim            it, and only the claim that holds the token settles it, so
--                  a worker whose lease expired (and whose delivery another
--                  worker claimed) cannot settle it a second time. NULL when
--                  no worker holds it.
-- created_at       when the fan-out inserted it.
CREATE TABLE webhook_deliveries (
    merchant_id      uuid        NOT NULL,
    endpoint_id      uuid        NOT NULL,
    event_id         uuid        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'abandoned')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    first_attempt_at timestamptz,
    lease_until      timestamptz,
    claim            uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, endpoint_id, event_id),
    FOREIGN KEY (merchant_id, endpoint_id) REFERENCES webhook_endpoints (merchant_id, id),
    CHECK ((lease_until IS NULL) = (claim IS NULL))
);

-- An endpoint's pending deliveries, the due ones first: what a claim reads
-- per endpoint, and counts (those leased) against the per-endpoint bound.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (merchant_id, endpoint_id, next_attempt_at)
    WHERE state = 'pending';
-- The events pending deliveries still need, which pruning spares.
CREATE INDEX webhook_deliveries_pending_events ON webhook_deliveries (merchant_id, event_id)
    WHERE state = 'pending';

-- Every attempt of every delivery, readable by the merchant.
--
-- merchant_id,     the endpoint's, as in webhook_deliveries.
-- endpoint_id
-- id               the attempt's; attempts are listed by attempted_at, id.
-- event_id         the event that was sent.
-- attempted_at     when the POST started.
-- status, error    the answer's HTTP status, or why there was none (refused,
--                  timed out, refused by the guard against server-side
--                  request forgery): one of the two, never both.
-- latency_ms       from the start of the POST to its answer or its failure.
CREATE TABLE webhook_attempts (
    merchant_id  uuid        NOT NULL,
    endpoint_id  uuid        NOT NULL,
    id           uuid        NOT NULL,
    event_id     uuid        NOT NULL,
    attempted_at timestamptz NOT NULL,
    status       integer     CHECK (status BETWEEN 100 AND 599),
    error        text        CHECK (length(error) BETWEEN 1 AND 1024),
    latency_ms   integer     NOT NULL CHECK (latency_ms >= 0),
    PRIMARY KEY (merchant_id, endpoint_id, id),
    FOREIGN KEY (merchant_id, endpoint_id) REFERENCES webhook_endpoints (merchant_id, id),
    CHECK ((status IS NULL) <> (error IS NULL))
);

-- An endpoint's attempts in the order they are listed.
CREATE INDEX webhook_attempts_by_time ON webhook_attempts (merchant_id, endpoint_id, attempted_at, id);
