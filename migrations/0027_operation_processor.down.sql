-- Refuses while an open operation names its processor: without the column,
-- any processor configured would look it up, and re-drive it if it found none.
DO $$
BEGIN
    IF EXISTS (SELECT FROM processor_operations WHERE processor IS NOT NULL AND next_check_at IS NOT NULL) THEN
        RAISE EXCEPTION 'open processor operations name their processor, which the former schema cannot keep';
    END IF;
END $$;

ALTER TABLE processor_operations DROP COLUMN processor;
