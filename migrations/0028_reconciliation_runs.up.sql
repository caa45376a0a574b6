-- The runs of payments reconcile, which compares our card charges with the
-- card processor's records (docs/processors.md, Reconciliation). The command
-- is a process of its own; it writes one row per finished run here, and
-- serve's metrics sampler reads the newest (payments_reconcile_mismatches,
-- payments_reconcile_last_run_timestamp_seconds), which the alerts watch. A
-- run that fails writes nothing, so the age alert catches a job that keeps
-- failing. Rows are never updated; one a day is nothing to prune.
CREATE TABLE reconciliation_runs (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    processor            text        NOT NULL CHECK (processor <> ''),
    window_start         timestamptz NOT NULL,
    window_end           timestamptz NOT NULL CHECK (window_end > window_start),
    finished_at          timestamptz NOT NULL DEFAULT now(),
    matched              integer     NOT NULL CHECK (matched >= 0),
    pending              integer     NOT NULL CHECK (pending >= 0),
    missing_on_our_side  integer     NOT NULL CHECK (missing_on_our_side >= 0),
    missing_at_processor integer     NOT NULL CHECK (missing_at_processor >= 0),
    amount_mismatch      integer     NOT NULL CHECK (amount_mismatch >= 0),
    state_mismatch       integer     NOT NULL CHECK (state_mismatch >= 0)
);

-- The newest run, for the sampler.
CREATE INDEX reconciliation_runs_finished ON reconciliation_runs (finished_at);

-- A reconciliation reads the authorizations created in its window.
CREATE INDEX processor_operations_created ON processor_operations (created_at) WHERE kind = 'authorize';
