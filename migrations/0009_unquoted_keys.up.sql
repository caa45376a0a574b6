-- An Idempotency-Key may be sent as a Structured Field string (RFC 8941,
-- section 3.3.3), as the IETF draft on the header defines it: "abc" names the
-- key abc, the same key as the bare abc. Until now the service took such a
-- value literally, quotes included. So that a retry sent after the upgrade
-- finds the key its first request stored before it, every stored key that is
-- a well-formed string holding a valid key (1 to 255 of 0x21-0x7E, in which
-- \" and \\ stand for " and \) becomes the key it holds.
--
-- Where the merchant already holds that key too, both spellings were
-- executed apart before the upgrade; the quoted row stays as it is, and is
-- no longer reachable: a retry sent either way finds the unquoted key.
--
-- The statement reads the whole table once and locks only the rows it
-- rewrites.
UPDATE idempotency_keys k
SET key = regexp_replace(substr(k.key, 2, length(k.key) - 2), '\\(["\\])', '\1', 'g')
WHERE k.key ~ '^"([\x21\x23-\x5B\x5D-\x7E]|\\["\\])+"$'
  AND NOT EXISTS (
      SELECT FROM idempotency_keys o
      WHERE o.merchant_id = k.merchant_id
        AND o.key = regexp_replace(substr(k.key, 2, length(k.key) - 2), '\\(["\\])', '\1', 'g'));
