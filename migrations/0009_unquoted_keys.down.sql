-- Nothing to undo: which stored keys were sent quoted is not recorded. (The
-- code before this migration reads a quoted value as a key of its own, quotes
-- included, as it always did.)
SELECT 1;
