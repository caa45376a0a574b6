DROP FUNCTION payments_event_horizon();
DROP FUNCTION payments_event_horizon_after(pg_snapshot);
