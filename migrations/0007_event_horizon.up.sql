-- The event horizon of this database: the feed (/v1/events) and the relay list
-- only events whose transaction id is below it, and order them by (tx_id, seq),
-- so that no event can ever appear behind a reader's cursor (migration 0002).
--
-- Until now the horizon was pg_snapshot_xmin(pg_current_snapshot()): the
-- oldest transaction running anywhere on the server. A writing transaction in
-- another database (another application's migration, a batch job, a forgotten
-- session) held every payment event back for as long as it ran, although it can
-- never write a row here: a PostgreSQL transaction writes only in the database
-- its backend is connected to. payments_event_horizon() is held back only by
-- transactions of this database: its backends, and its prepared transactions.
--
-- horizon is the lowest of: the in-progress transaction ids of a snapshot S0
-- that, when looked at after S0, are still running in a backend of this
-- database or prepared in it; and S0's xmax. It is correct for a read that
-- takes its snapshot after this function returns (the next statement, at READ
-- COMMITTED), by these steps, in this order:
--
--   1. S0 is taken (t0). Every transaction id below xmax(S0) was assigned
--      before t0; every one assigned later is >= xmax(S0) >= horizon.
--   2. This database's backends are read (t1 > t0), with a fresh copy of the
--      backend table (pg_stat_clear_snapshot: the copy is otherwise kept for the
--      whole transaction). A transaction T of this database with an id x in
--      S0's in-progress list is either still running at t1, and then its
--      backend shows x and horizon <= x, or it has ended (or prepared) by t1.
--   3. Prepared transactions of this database are read (t2 > t1). A T that
--      prepared before t1 is either still prepared at t2 (horizon <= x) or has
--      ended by t2. Reading them before the backends would miss a T that moved
--      from its backend to the prepared list between the two reads.
--   4. The caller's read takes its snapshot after t2: every T with x < horizon
--      has ended by then, so its events are in that snapshot or never will be,
--      and nothing can later appear below the horizon.
--
-- Reading the backends first and S0 second would lose step 1's bound (an id
-- assigned in between would be neither listed nor above xmax); reading the
-- events in the same statement would use a snapshot older than t1, which does
-- not see a T that ended between the two. Under REPEATABLE READ or SERIALIZABLE
-- the caller's read uses the transaction's first snapshot, not a later one, so
-- the function then returns that snapshot's xmin, the server-wide horizon,
-- which is correct for any read under the same snapshot.
--
-- The steps after the first are payments_event_horizon_after(S0), so that a
-- test can run something between step 1 and the rest (horizon_test.go).
--
-- holder_pid, holder_xid and holder_since name what holds the horizon below
-- xmax(S0), when something does: the backend (pid, xact_start) or the prepared
-- transaction (pid NULL, its prepare time). xact_start is NULL for another
-- role's backend unless the caller has pg_read_all_stats.
CREATE FUNCTION payments_event_horizon_after(
    s0 pg_snapshot, OUT horizon xid8, OUT holder_pid integer, OUT holder_xid xid8, OUT holder_since timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    running xid8;
    prepared xid8;
    prepared_at timestamptz;
BEGIN
    horizon := pg_snapshot_xmax(s0);
    PERFORM pg_stat_clear_snapshot();

    -- A 32-bit backend_xid matches one id of S0's list: running ids span less
    -- than 2^31, so no two of them share their low 32 bits.
    SELECT x, a.pid, a.xact_start INTO running, holder_pid, holder_since
    FROM pg_snapshot_xip(s0) AS x
    JOIN pg_stat_activity AS a
      ON a.backend_xid::text::bigint = x::text::bigint % 4294967296
    WHERE a.datname = current_database()
    ORDER BY x
    LIMIT 1;

    SELECT x, p.prepared INTO prepared, prepared_at
    FROM pg_snapshot_xip(s0) AS x
    JOIN pg_prepared_xacts AS p
      ON p.transaction::text::bigint = x::text::bigint % 4294967296
    WHERE p.database = current_database()
    ORDER BY x
    LIMIT 1;

    IF running IS NOT NULL THEN
        horizon := running;
        holder_xid := running;
    END IF;
    IF prepared IS NOT NULL AND prepared < horizon THEN
        horizon := prepared;
        holder_xid := prepared;
        holder_pid := NULL;
        holder_since := prepared_at;
    END IF;
END
$$;

CREATE FUNCTION payments_event_horizon(
    OUT horizon xid8, OUT holder_pid integer, OUT holder_xid xid8, OUT holder_since timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s0 pg_snapshot;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        horizon := pg_snapshot_xmin(pg_current_snapshot());
        RETURN;
    END IF;
    -- Its own statement: the steps after it take their snapshots later.
    s0 := pg_current_snapshot();
    SELECT * INTO horizon, holder_pid, holder_xid, holder_since FROM payments_event_horizon_after(s0);
END
$$;
