-- Version 4: the replicas serving from this store, each with its last heartbeat (by the
-- database's clock). Replicas count the live ones to share tenants' rate and concurrency
-- limits.
CREATE TABLE tw_replicas (
    name      TEXT PRIMARY KEY,
    last_seen TIMESTAMPTZ NOT NULL DEFAULT now()
);
