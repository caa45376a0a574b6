-- Refuses while a resolution is recorded: it is the audit of who settled a
-- charge and why, which the former schema has nowhere to keep.
DO $$
BEGIN
    IF EXISTS (SELECT FROM charge_resolutions) THEN
        RAISE EXCEPTION 'charge_resolutions holds the audit of settled reviews, which the former schema cannot keep';
    END IF;
END $$;

DROP TABLE charge_resolutions;
