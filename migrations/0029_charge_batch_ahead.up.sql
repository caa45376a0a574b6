-- A batch of charges decided ahead (internal/charging, ahead.go): the service
-- decided its members against its own record of their accounts, and sends the
-- decisions, this check and the writes in one round trip that ends with the
-- commit. The check runs first, in the batch's transaction, and takes the
-- locks a batch takes (each key's advisory lock, each account's row), none of
-- them waiting: it returns when every key is free here and stored nowhere,
-- every account is as the record says (its currency and balance, no holds),
-- and the batch's clock lies between the transaction's start less a second
-- and this moment, so that anything that follows the charge reads a later
-- clock. Otherwise it raises PA001 and the transaction, its writes with it,
-- rolls back: the batch then runs as one that locks and reads first.
CREATE FUNCTION payments_charge_batch_expect(
    key_merchants uuid[], keys text[],
    account_merchants uuid[], account_ids uuid[], currencies text[], balances bigint[],
    batch_clock timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    locked integer;
BEGIN
    IF batch_clock > clock_timestamp() OR batch_clock < now() - interval '1 second' THEN
        RAISE EXCEPTION 'the batch''s clock % is not the database''s %', batch_clock, now() USING ERRCODE = 'PA001';
    END IF;
    IF NOT (SELECT bool_and(pg_try_advisory_xact_lock(hashtextextended(u.m::text || u.k, 0)))
            FROM unnest(key_merchants, keys) AS u(m, k)) THEN
        RAISE EXCEPTION 'a key of the batch is in flight' USING ERRCODE = 'PA001';
    END IF;
    -- Each key and each account is looked up by its primary key from the
    -- arrays (LATERAL): a function's plans are cached for its connection's
    -- life, and one made while a table was empty could otherwise scan the
    -- whole index for every batch once the table is not.
    IF EXISTS (SELECT FROM unnest(key_merchants, keys) AS u(m, k),
               LATERAL (SELECT FROM idempotency_keys ik WHERE ik.merchant_id = u.m AND ik.key = u.k LIMIT 1) stored) THEN
        RAISE EXCEPTION 'a key of the batch is stored' USING ERRCODE = 'PA001';
    END IF;
    -- No lock is waited for (SKIP LOCKED), so the order they are taken in
    -- cannot deadlock.
    SELECT count(*) INTO locked
    FROM unnest(account_merchants, account_ids, currencies, balances) AS e(m, id, currency, balance),
    LATERAL (SELECT FROM accounts a
             WHERE a.merchant_id = e.m AND a.id = e.id AND a.currency = e.currency AND a.balance = e.balance AND a.held = 0
             FOR UPDATE OF a SKIP LOCKED) l;
    IF locked <> cardinality(account_ids) THEN
        RAISE EXCEPTION 'an account of the batch is locked elsewhere or not as recorded' USING ERRCODE = 'PA001';
    END IF;
END $$;
