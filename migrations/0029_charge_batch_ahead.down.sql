DROP FUNCTION payments_charge_batch_expect(uuid[], text[], uuid[], uuid[], text[], bigint[], timestamptz);
