-- Charges at a card processor. A charge names exactly one of account_id (a
-- charge of an account here, as before) or payment_method (a card at an
-- external processor). A card charge moves no account's balance and holds
-- nothing here: the triggers, constraints and sweeps on balances and holds
-- all go through account_id, which it lacks, and its authorizations have no
-- expires_at (the processor decides when they lapse), so the expiry sweep
-- never finds one.
--
-- Its statuses add to the others: processing (the outcome is not known yet),
-- reversing (a reversal by our reference is under way), reversed (it was
-- taken back at the processor) and requires_review (a reversal was refused
-- too often: a human decides).
ALTER TABLE charges
    ALTER COLUMN account_id DROP NOT NULL,
    ADD COLUMN payment_method text CHECK (payment_method ~ '^pm_[A-Za-z0-9_]{1,64}$'),
    ADD COLUMN psp_reference text,
    ADD COLUMN decline_code text,
    ADD CONSTRAINT charges_payer_check CHECK ((account_id IS NULL) <> (payment_method IS NULL)),
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check
        CHECK (status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired',
                          'processing', 'reversing', 'reversed', 'requires_review')),
    ADD CONSTRAINT charges_card_status_check
        CHECK (payment_method IS NOT NULL OR status IN ('succeeded', 'failed', 'authorized', 'voided', 'expired')),
    DROP CONSTRAINT charges_expiry_check,
    ADD CONSTRAINT charges_expiry_check
        CHECK (account_id IS NULL OR status NOT IN ('authorized', 'voided', 'expired') OR expires_at IS NOT NULL);

-- One row per operation at the processor (an authorization now; captures,
-- voids and refunds later). id is our reference, sent to the processor
-- (an authorization's is its charge's id); processor_key is the processor's
-- idempotency key, derived from id and kind, the same on every attempt.
-- next_check_at is when recovery looks at it next (NULL once final);
-- decision_deadline is when the processor has decided whatever it received.
CREATE TABLE processor_operations (
    merchant_id       uuid        NOT NULL,
    id                uuid        NOT NULL,
    charge_id         uuid        NOT NULL,
    kind              text        NOT NULL CHECK (kind IN ('authorize')),
    state             text        NOT NULL CHECK (state IN ('processing', 'succeeded', 'failed',
                                                            'reversing', 'reversed', 'requires_review')),
    processor_key     text        NOT NULL,
    amount            bigint      NOT NULL CHECK (amount > 0),
    currency          text        NOT NULL,
    payment_method    text        NOT NULL,
    capture           boolean     NOT NULL,
    psp_reference     text,
    decision_deadline timestamptz NOT NULL,
    next_check_at     timestamptz,
    attempts          integer     NOT NULL DEFAULT 0,
    reversal_attempts integer     NOT NULL DEFAULT 0,
    -- Each entry into reversing is a reversal of its own at the processor,
    -- under a key of its own (a late approval is reversed again).
    reversal_round    integer     NOT NULL DEFAULT 0,
    last_code         text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    resolved_at       timestamptz,
    PRIMARY KEY (merchant_id, id),
    FOREIGN KEY (merchant_id, charge_id) REFERENCES charges (merchant_id, id),
    CHECK ((next_check_at IS NULL) = (state IN ('succeeded', 'failed', 'reversed', 'requires_review')))
);

-- The recovery worker claims the due operations, oldest due first.
CREATE INDEX processor_operations_due ON processor_operations (next_check_at) WHERE next_check_at IS NOT NULL;
-- A processor's webhook names our reference, not our merchant.
CREATE INDEX processor_operations_reference ON processor_operations (id);
-- The operations an operator reviews, and the gauge that alerts on them.
CREATE INDEX processor_operations_review ON processor_operations (created_at) WHERE state = 'requires_review';

-- The processor's webhook events applied, by the processor's event id: one
-- delivered twice is applied once.
CREATE TABLE processor_events (
    merchant_id  uuid        NOT NULL,
    id           text        NOT NULL,
    operation_id uuid        NOT NULL,
    type         text        NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, id)
);
