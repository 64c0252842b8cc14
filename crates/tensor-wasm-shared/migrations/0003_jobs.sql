-- Version 3: the shared queue of asynchronous jobs.
-- `record` is the job as submitted (its JSON encoding); the columns beside it are its state,
-- which claims, renewals and outcomes change. A job is claimed by one replica at a time under a
-- lease (`lease_owner`, `lease_until`, by the database's clock); `attempts` counts its starts
-- and fences each attempt's writes.
CREATE TABLE tw_jobs (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    status           TEXT NOT NULL,
    record           JSONB NOT NULL,
    outcome          JSONB,
    attempts         INT NOT NULL DEFAULT 0,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    created_at_ms    BIGINT NOT NULL,
    started_at_ms    BIGINT,
    finished_at_ms   BIGINT,
    lease_owner      TEXT,
    lease_until      TIMESTAMPTZ,
    idempotency_key  TEXT,
    UNIQUE (tenant, idempotency_key)
);
-- What a claim scans: unfinished jobs, oldest first.
CREATE INDEX tw_jobs_unfinished ON tw_jobs (created_at_ms, id)
    WHERE status IN ('queued', 'running');
CREATE INDEX tw_jobs_tenant_active ON tw_jobs (tenant) WHERE status IN ('queued', 'running');
CREATE INDEX tw_jobs_finished ON tw_jobs (tenant, finished_at_ms) WHERE finished_at_ms IS NOT NULL;
