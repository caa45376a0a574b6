-- Delivery of the outbox: the relay's notification, and the worked-example
-- consumer's inbox and effect.

-- Wake the relay when events commit. A statement-level trigger sends one
-- notification per inserting statement; PostgreSQL folds identical
-- notifications of one transaction into one and delivers it on commit.
CREATE FUNCTION notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('payments_events', '');
    RETURN NULL;
END $$;

CREATE TRIGGER events_notify AFTER INSERT ON events
FOR EACH STATEMENT EXECUTE FUNCTION notify_events();

-- The consumer's inbox: one row per event it has applied, written in the same
-- transaction as the effect, so a redelivered event is recognised and skipped.
CREATE TABLE inbox (
    merchant_id uuid        NOT NULL,
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, consumer, event_id)
);

-- The consumer's effect: each account's balance, rebuilt from events alone.
-- After every event is applied exactly once it equals accounts.balance.
CREATE TABLE account_balances (
    merchant_id uuid   NOT NULL,
    account_id  uuid   NOT NULL,
    balance     bigint NOT NULL,
    events      bigint NOT NULL,
    PRIMARY KEY (merchant_id, account_id)
);
