-- A batch of charges decided ahead (internal/charging, ahead.go) is now
-- checked by the statement that writes it (internal/postgres, chargesql.go:
-- writeAheadSQL), which calls this to refuse it: PA001, and the whole
-- transaction rolls back. payments_charge_batch_expect (0029) did the check
-- in a call of its own, which cost a batch of one a sixth of the database's
-- time for it (docs/benchmarks.md, "Issue 47: what a batch costs the database"); it
-- stays for replicas still running the build before this one, and a later
-- migration drops it.
CREATE FUNCTION payments_charge_batch_refused(reason text) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'batch refused: %', reason USING ERRCODE = 'PA001';
END $$;
