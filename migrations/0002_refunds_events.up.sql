-- Refunds, the charge listing index, and the transactional outbox of events.

CREATE TABLE refunds (
    merchant_id uuid        NOT NULL,
    id          uuid        NOT NULL,
    charge_id   uuid        NOT NULL,
    account_id  uuid        NOT NULL,
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, id),
    FOREIGN KEY (merchant_id, charge_id) REFERENCES charges (merchant_id, id)
);

CREATE INDEX refunds_charge ON refunds (merchant_id, charge_id);

-- GET /v1/charges pages newest first by seq, optionally for one account.
DROP INDEX charges_account;
CREATE INDEX charges_feed ON charges (merchant_id, seq);
CREATE INDEX charges_account_feed ON charges (merchant_id, account_id, seq);

-- The outbox: one row per money movement, written in the transaction of the
-- change it describes.
--
-- Order. seq is drawn when the row is inserted, but transactions commit in
-- another order, so a reader that pages by seq alone could pass a low seq that
-- commits later and skip it. tx_id (the inserting transaction's id) fixes that:
-- readers only look at rows whose transaction is older than every transaction
-- still running (tx_id < pg_snapshot_xmin(pg_current_snapshot())). No new row can
-- ever appear in that prefix, so paging it by (tx_id, seq) never skips or repeats.
-- Changes that depend on each other (the same account, the same charge) run in
-- order, so their transactions' ids are in that order too.
CREATE TABLE events (
    merchant_id    uuid        NOT NULL,
    id             uuid        NOT NULL,
    tx_id          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    seq            bigint      GENERATED ALWAYS AS IDENTITY,
    aggregate_type text        NOT NULL,
    aggregate_id   uuid        NOT NULL,
    type           text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz,
    PRIMARY KEY (merchant_id, id)
);

CREATE INDEX events_feed ON events (merchant_id, tx_id, seq);
-- The relay reads what is left to publish, in order.
CREATE INDEX events_unpublished ON events (tx_id, seq) WHERE published_at IS NULL;
