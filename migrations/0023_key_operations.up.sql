-- A key may be bound to an operation that goes on after the transaction that
-- claimed it (a charge at a card processor): its row then commits with
-- operation_id and no response (status and body NULL), and the operation
-- stores the response when it ends. Until then the key answers from the
-- operation, never expires, and is not the janitor's.
ALTER TABLE idempotency_keys ADD COLUMN operation_id uuid;

COMMENT ON COLUMN idempotency_keys.operation_id IS
    'the operation the key is bound to; with a NULL status, it is still going on';

-- An operation's store finds its key by it.
CREATE UNIQUE INDEX idempotency_keys_operation ON idempotency_keys (merchant_id, operation_id)
    WHERE operation_id IS NOT NULL;
