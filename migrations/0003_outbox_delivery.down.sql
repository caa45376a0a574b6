DROP TABLE account_balances;
DROP TABLE inbox;
DROP TRIGGER events_notify ON events;
DROP FUNCTION notify_events();
