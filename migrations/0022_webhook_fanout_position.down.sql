-- The former fan-out reads every live enabled endpoint from its cursor, which
-- this one keeps exact: dropping the position and the flags loses nothing.
DROP TRIGGER webhook_endpoint_enabled ON webhook_endpoints;
DROP FUNCTION webhook_endpoint_enabled();
DROP INDEX webhook_endpoints_behind;
ALTER TABLE webhook_endpoints DROP COLUMN behind;
DROP TABLE webhook_fanout_position;
