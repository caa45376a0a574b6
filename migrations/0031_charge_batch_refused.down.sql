DROP FUNCTION payments_charge_batch_refused(text);
