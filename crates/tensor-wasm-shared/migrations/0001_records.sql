-- Records of the shared store, version 1: functions, modules, snapshots and the change log.
-- Each record is its JSON encoding (the same as the embedded store's files); the columns
-- beside it are what queries select by.
CREATE TABLE tw_modules (
    sha256     TEXT PRIMARY KEY,
    size       BIGINT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE tw_functions (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    record     JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX tw_functions_tenant ON tw_functions (tenant);

CREATE TABLE tw_snapshots (
    function_id   TEXT NOT NULL,
    id            TEXT NOT NULL,
    record        JSONB NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (function_id, id)
);

-- Every change of a function record, in commit order of the sequence; replicas follow it to
-- invalidate their caches (woken by NOTIFY tw_changes, caught up by sequence number).
CREATE TABLE tw_changes (
    seq  BIGSERIAL PRIMARY KEY,
    kind TEXT NOT NULL,
    key  TEXT NOT NULL,
    at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
