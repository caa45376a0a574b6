DROP VIEW unpublished_events;
ALTER TABLE events ADD COLUMN published_at timestamptz;
UPDATE events e SET published_at = c.moved_at
FROM outbox_cursor c
WHERE c.stream = 'relay' AND (e.tx_id, e.seq) <= (c.tx_id, c.seq);
CREATE INDEX events_unpublished ON events (tx_id, seq) WHERE published_at IS NULL;
DROP INDEX events_order;
DROP TABLE outbox_cursor;
