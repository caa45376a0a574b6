package migrations

// UpFrom is Up with the migrations in fsys, for tests of a failing migration.
var UpFrom = up
