-- Webhook endpoints (docs/webhooks.md): a merchant's URL that receives the
-- merchant's events of the types it subscribes to, signed with its secret.
-- The deliveries and the record of attempts come with the worker that makes
-- them; this table is all that creating, listing and deleting endpoints need.
--
-- merchant_id, id  the merchant's, as every key starts (migration 0001); id is
--                  the endpoint's, shown as we_<id>.
-- url              where deliveries are POSTed; checked against server-side
--                  request forgery at creation (internal/webhook), bounded here.
-- events           the event types subscribed to: {*} for all, or one or more
--                  types (payment.ValidateWebhookEvents decides which).
-- secret           signs the deliveries, whole (whsec_ included). Shown once,
--                  in the answer that created the endpoint; never listed.
-- status           'enabled' while it receives deliveries; 'disabled' after
--                  its deliveries failed for the whole retry period.
-- created_at       when it was created; lists are oldest first.
-- deleted_at       set by deletion, which keeps the row: a deleted endpoint is
--                  neither listed, read nor counted, and its deliveries stop at
--                  their next attempt. NULL while live.
-- cursor_tx,       the fan-out's position in the events feed: (tx_id, seq) of
-- cursor_seq       the last event it has considered, advanced exactly as the
--                  feed pages, below the event horizon (migration 0007), so no
--                  event is passed over. A new endpoint starts at the horizon of
--                  its creation, (payments_event_horizon(), 0): every event
--                  below it was committed before (or never will be), and it
--                  receives every event from then on. The relay's pruning must
--                  spare the events after a live endpoint's cursor.
--
-- At most payment.MaxWebhookEndpoints live endpoints per merchant: counted
-- under the merchant's row lock (internal/postgres/webhooks.go), which
-- serializes creations, so no constraint here.
CREATE TABLE webhook_endpoints (
    merchant_id uuid        NOT NULL REFERENCES merchants (id),
    id          uuid        NOT NULL,
    url         text        NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    events      text[]      NOT NULL CHECK (cardinality(events) >= 1),
    secret      text        NOT NULL CHECK (secret LIKE 'whsec\_%'),
    status      text        NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz,
    cursor_tx   xid8        NOT NULL,
    cursor_seq  bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (merchant_id, id)
);

-- A merchant's live endpoints, oldest first: the list, and the count that
-- enforces the limit.
CREATE INDEX webhook_endpoints_live ON webhook_endpoints (merchant_id, created_at, id) WHERE deleted_at IS NULL;
