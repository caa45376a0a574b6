-- The relay's progress is a cursor, not a mark on every event.
--
-- Until now the relay set events.published_at on every event it published:
-- one more write per event, and not a HOT one (the column is in the partial
-- index of unpublished events), so a new tuple and new entries in every index
-- of events, then a delete by the pruner. Events are now immutable once
-- inserted. The relay publishes in (tx_id, seq) order, below the event
-- horizon (migration 0007), and only ever an unbroken prefix of that order;
-- so what it has published is exactly the events at or below the last one it
-- published, which outbox_cursor holds: one row, updated once per published
-- batch by the relay that holds the outbox lease.
CREATE TABLE outbox_cursor (
    stream   text        PRIMARY KEY,
    tx_id    xid8        NOT NULL,
    seq      bigint      NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now()
);

-- The cursor starts at the greatest published event below the least
-- unpublished one: where the marks were an unbroken prefix (the relay only
-- ever made them so) that is the last published event; were they not, the
-- events published above the gap are published again, and JetStream or the
-- consumers' inboxes drop them, rather than anything being skipped.
WITH last AS (
    SELECT p.tx_id, p.seq
    FROM events p
    WHERE p.published_at IS NOT NULL
      AND NOT EXISTS (
          SELECT FROM events u
          WHERE u.published_at IS NULL AND (u.tx_id, u.seq) < (p.tx_id, p.seq))
    ORDER BY p.tx_id DESC, p.seq DESC
    LIMIT 1
)
INSERT INTO outbox_cursor (stream, tx_id, seq)
SELECT 'relay', coalesce((SELECT tx_id FROM last), '0'), coalesce((SELECT seq FROM last), 0);

-- The relay reads the events after the cursor in order, the pruner deletes
-- the oldest at or before it, and the backlog counts those after it.
CREATE INDEX events_order ON events (tx_id, seq);
DROP INDEX events_unpublished;
ALTER TABLE events DROP COLUMN published_at;

-- The events the relay has yet to publish, for the metrics and the operator.
CREATE VIEW unpublished_events AS
SELECT e.*
FROM events e
JOIN outbox_cursor c ON c.stream = 'relay'
WHERE (e.tx_id, e.seq) > (c.tx_id, c.seq);
