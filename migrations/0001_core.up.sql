-- Core schema: merchants and their API keys, accounts, deposits, charges and the
-- idempotency keys that make every POST safe to retry.
--
-- Every primary and unique key on a merchant's data starts with merchant_id, so the
-- schema can be distributed by merchant (Citus) with a merchant's rows on one shard.
-- merchants and api_keys are small lookup tables (Citus reference tables).

-- Descriptions, metadata and stored responses are UTF-8; in a SQL_ASCII or
-- LATIN1 database some of them would fail as 500s after the key is claimed.
DO $$
BEGIN
    IF current_setting('server_encoding') <> 'UTF8' THEN
        RAISE EXCEPTION 'database encoding is %, payments needs UTF8: CREATE DATABASE ... TEMPLATE template0 ENCODING ''UTF8'' LC_COLLATE ''C'' LC_CTYPE ''C''',
            current_setting('server_encoding');
    END IF;
END $$;

CREATE TABLE merchants (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored only as SHA-256 hashes; the secret is shown once on creation.
CREATE TABLE api_keys (
    hash        bytea       PRIMARY KEY CHECK (length(hash) = 32),
    merchant_id uuid        NOT NULL REFERENCES merchants (id),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE accounts (
    merchant_id uuid        NOT NULL REFERENCES merchants (id),
    id          uuid        NOT NULL,
    currency    text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    -- The balance can never go negative: charges debit it with a conditional
    -- UPDATE ... WHERE balance >= amount, and this constraint backs that up.
    balance     bigint      NOT NULL DEFAULT 0 CHECK (balance >= 0),
    description text,
    metadata    jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, id)
);

CREATE TABLE deposits (
    merchant_id uuid        NOT NULL,
    id          uuid        NOT NULL,
    account_id  uuid        NOT NULL,
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, id),
    FOREIGN KEY (merchant_id, account_id) REFERENCES accounts (merchant_id, id)
);

CREATE INDEX deposits_account ON deposits (merchant_id, account_id);

CREATE TABLE charges (
    merchant_id     uuid        NOT NULL,
    id              uuid        NOT NULL,
    account_id      uuid        NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('succeeded', 'failed')),
    failure_code    text,
    amount_refunded bigint      NOT NULL DEFAULT 0 CHECK (amount_refunded BETWEEN 0 AND amount),
    description     text,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- seq orders listings in creation (commit-independent insert) order.
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (merchant_id, id),
    FOREIGN KEY (merchant_id, account_id) REFERENCES accounts (merchant_id, id),
    CHECK ((status = 'failed') = (failure_code IS NOT NULL)),
    CHECK (status = 'succeeded' OR amount_refunded = 0)
);

CREATE INDEX charges_account ON charges (merchant_id, account_id);

-- One row per (merchant, Idempotency-Key). The row is inserted in the same
-- transaction as the business change it guards, and the response is stored before
-- that transaction commits, so other transactions only ever see complete rows:
-- status and body are NULL only inside the claiming transaction.
CREATE TABLE idempotency_keys (
    merchant_id uuid        NOT NULL,
    key         text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint bytea       NOT NULL,
    status      smallint,
    location    text,
    body        bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, key)
);

-- The retention janitor deletes expired keys oldest first.
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
