DROP TABLE events;
DROP INDEX charges_account_feed;
DROP INDEX charges_feed;
CREATE INDEX charges_account ON charges (merchant_id, account_id);
DROP TABLE refunds;
