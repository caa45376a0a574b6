-- The webhook fan-out (internal/postgres/fanout.go) no longer reads every
-- live enabled endpoint in every round. It ran a read of the events after
-- each endpoint's cursor for all of them, up to 50 rounds a second on each
-- replica: 1.5 ms a round without endpoints, 20 ms with 16,000 endpoints
-- whose merchants wrote nothing. A round now reads the events that came
-- since the last one, in feed order below the event horizon, from a position
-- kept here, and fans out only to the endpoints of the merchants it found
-- there, plus those known to be behind. What makes that enough: every live
-- enabled endpoint not behind has fanned out all its merchant's events up to
-- the position.
--
-- webhook_fanout_position  one row: (tx_id, seq) of the last event a round
--                          read, moved only by the fan-out, under its lock.
-- webhook_endpoints.behind the endpoint may have events at or before the
--                          position still to fan out: it is new or enabled
--                          again (a round running as it was created could
--                          not see it, yet moved the position over its first
--                          events), or its last read filled a batch. Every
--                          round reads these through the partial index, and
--                          clears the flag once a read comes back short.
--
-- The position starts at the event horizon (migration 0007), as a new
-- endpoint's cursor does: no event can appear before it. Every endpoint starts behind (the column's default, which
-- PostgreSQL adds without rewriting the table), so the first round reads
-- each live enabled one from its own cursor, as rounds did until now, and
-- nothing between the cursors and the position is skipped across the
-- upgrade.
--
-- A trigger, not the code that enables, flags an endpoint enabled again: a
-- release before this one, still serving beside it during a rollout, enables
-- endpoints without a word of the flag (and creates them behind by the
-- default, and fans out from the cursors alone, which breaks nothing here).
CREATE TABLE webhook_fanout_position (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    tx_id  xid8    NOT NULL,
    seq    bigint  NOT NULL
);
INSERT INTO webhook_fanout_position (tx_id, seq)
SELECT horizon, 0 FROM payments_event_horizon();

ALTER TABLE webhook_endpoints ADD COLUMN behind boolean NOT NULL DEFAULT true;
CREATE INDEX webhook_endpoints_behind ON webhook_endpoints (merchant_id, id)
    WHERE behind AND deleted_at IS NULL AND status = 'enabled';

CREATE FUNCTION webhook_endpoint_enabled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.behind := true;
    RETURN NEW;
END
$$;
CREATE TRIGGER webhook_endpoint_enabled BEFORE UPDATE OF status ON webhook_endpoints
    FOR EACH ROW WHEN (OLD.status <> 'enabled' AND NEW.status = 'enabled')
    EXECUTE FUNCTION webhook_endpoint_enabled();
