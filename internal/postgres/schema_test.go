package postgres_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// undistributed lists the tables of the migrated schema that would not be
// distributed by merchant_id on Citus, each with the reason. Every other table
// must be distributable (TestSchemaIsDistributableByMerchant). Adding a table
// here is a design decision: say why in docs/scaling.md as well.
var undistributed = map[string]struct {
	kind string // "reference": copied to every node; "local": stays on the coordinator
	why  string
}{
	// Keyed by id, which is the distribution value itself (every other table's
	// merchant_id). It must be a reference table because api_keys, a reference
	// table, references it: Citus refuses a foreign key from a reference table
	// to a distributed one. One row per merchant, written once.
	"merchants": {"reference", "keyed by id, the merchant id itself; referenced by api_keys"},
	// Authentication finds a key by its hash (merchantOfKeySQL) and revocation
	// by its public id (api-keys revoke KEY_ID) before the merchant is known:
	// distributed by merchant_id both would ask every shard, and neither hash
	// nor id could stay unique across merchants. A few rows per merchant;
	// written on create and revoke and, per key, at most once a minute
	// (last_used_at).
	"api_keys": {"reference", "looked up by hash and by key id before the merchant is known"},
	// The relay's position in feed order (migration 0008), one row per
	// relay stream, written by the lease holder once per published batch.
	// Feed order is by transaction id, which is per node: on Citus each
	// worker group would have its relay and its own row (see docs/scaling.md).
	"outbox_cursor": {"local", "the relay's position in feed order, one row per relay; per worker group on Citus"},
	// The webhook fan-out's position in feed order (migration 0022), one
	// row, written by the round that holds the fan-out's lock. Like
	// outbox_cursor: feed order is by transaction id, which is per node, so
	// each worker group would keep its own (see docs/scaling.md).
	"webhook_fanout_position": {"local", "the webhook fan-out's position in feed order, one row; per worker group on Citus"},
	// The runs of payments reconcile (migration 0028), one row per run of an
	// operator's job, a day's at a time, about every merchant's charges at
	// the processor; serve's metrics sampler reads the newest.
	"reconciliation_runs": {"local", "one row per run of payments reconcile, across merchants; read by the metrics sampler"},
	// golang-migrate's bookkeeping (version, dirty), one row. Migrations run
	// against the coordinator, and nothing of the service reads it.
	"schema_migrations": {"local", "golang-migrate's version row, read only by migrate on the coordinator"},
}

// TestSchemaIsDistributableByMerchant reads the migrated schema from the
// catalog and checks that Citus could distribute every table not listed in
// undistributed by merchant_id, with a merchant's rows on one shard: each has
// a NOT NULL merchant_id; each of its primary keys, unique indexes and
// exclusion constraints has merchant_id among its key columns (Citus can only
// enforce uniqueness within a shard); and each foreign key between two such
// tables pairs merchant_id with merchant_id. A foreign key from an
// undistributed table to a distributed one is refused too, as Citus would.
func TestSchemaIsDistributableByMerchant(t *testing.T) {
	conn, err := pgx.Connect(t.Context(), pgtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(t.Context()) })

	type table struct{ hasMerchant, notNull bool }
	tables := map[string]table{}
	rows, err := conn.Query(t.Context(), `
SELECT c.relname, a.attname IS NOT NULL, coalesce(a.attnotnull, false)
FROM pg_class c
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'merchant_id' AND NOT a.attisdropped
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')`)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var tb table
	if _, err := pgx.ForEachRow(rows, []any{&name, &tb.hasMerchant, &tb.notNull}, func() error {
		tables[name] = tb
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Not vacuous: the catalog query sees the schema the service uses.
	for _, want := range []string{"idempotency_keys", "charges", "events", "merchants", "api_keys"} {
		if _, ok := tables[want]; !ok {
			t.Fatalf("table %s not found in the current schema; tables seen: %v", want, tables)
		}
	}
	distributed := func(table string) bool { _, ok := undistributed[table]; return !ok }

	for name := range undistributed {
		if _, ok := tables[name]; !ok {
			t.Errorf("undistributed lists %s, which the schema no longer has: remove it", name)
		}
	}
	for name, tb := range tables {
		if distributed(name) && (!tb.hasMerchant || !tb.notNull) {
			t.Errorf("table %s has no NOT NULL merchant_id to be distributed by: add one, or list it in undistributed with the reason",
				name)
		}
	}

	// Primary keys, unique indexes and constraints, exclusion constraints;
	// only key columns count (INCLUDE columns do not make a row unique).
	rows, err = conn.Query(t.Context(), `
SELECT c.relname, pg_get_indexdef(x.indexrelid),
       EXISTS (SELECT FROM unnest((x.indkey::int2[])[0:x.indnkeyatts - 1]) k
               JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k
               WHERE a.attname = 'merchant_id')
FROM pg_index x
JOIN pg_class c ON c.oid = x.indrelid
WHERE c.relnamespace = current_schema()::regnamespace AND (x.indisunique OR x.indisexclusion)`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		def         string
		hasMerchant bool
		checked     []string
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &def, &hasMerchant}, func() error {
		if !distributed(name) {
			return nil
		}
		checked = append(checked, def)
		if !hasMerchant {
			t.Errorf("%s: a unique key without merchant_id cannot be enforced on a table distributed by merchant_id; add merchant_id to it",
				def)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(checked, func(d string) bool { return strings.Contains(d, " idempotency_keys_pkey ") }) {
		t.Errorf("the primary key of idempotency_keys was not among the unique keys checked: %q", checked)
	}

	rows, err = conn.Query(t.Context(), `
SELECT con.conname, src.relname, dst.relname,
       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n ORDER BY k.i),
       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n ORDER BY k.i)
FROM pg_constraint con
JOIN pg_class src ON src.oid = con.conrelid
JOIN pg_class dst ON dst.oid = con.confrelid
WHERE con.contype = 'f' AND src.relnamespace = current_schema()::regnamespace`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		conname, from, to string
		fromCols, toCols  []string
	)
	if _, err := pgx.ForEachRow(rows, []any{&conname, &from, &to, &fromCols, &toCols}, func() error {
		switch {
		case !distributed(to) && undistributed[to].kind != "reference":
			t.Errorf("foreign key %s of %s references %s, a %s table: only reference tables can be referenced from every node",
				conname, from, to, undistributed[to].kind)
		case !distributed(to):
			// To a reference table: allowed from any table.
		case !distributed(from):
			t.Errorf("foreign key %s of %s (not distributed) references %s (distributed): Citus refuses it", conname, from, to)
		default:
			i := slices.Index(fromCols, "merchant_id")
			if i < 0 || toCols[i] != "merchant_id" {
				t.Errorf("foreign key %s (%s %v → %s %v) does not pair merchant_id with merchant_id: the rows it joins may sit on different shards",
					conname, from, fromCols, to, toCols)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
