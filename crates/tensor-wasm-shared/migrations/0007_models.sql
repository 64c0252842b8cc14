-- Version 7: models tenants store for wasi-nn's load-by-name (docs/models.md).
-- `tw_models` holds one record per tenant and name (its JSON encoding, as the embedded store
-- writes it); the primary key makes a name unique per tenant, so of two replicas storing one
-- name at once, one inserts and the other's insert does nothing and is refused as a conflict.
-- Changes are announced in tw_changes (kind 'model', key '<tenant>/<name>').
-- The bytes are content-addressed blobs (models/<sha256>.onnx), written before the record;
-- `tw_model_blobs` indexes them as `tw_modules` indexes modules (migrations 1 and 6): a store
-- touches the row under the blob's advisory lock before its upload and writes its record only
-- if the row's generation is unchanged, and the orphan collector removes bytes no record names
-- under the same lock, the row before the blob.
CREATE SEQUENCE tw_model_blob_generations;
CREATE TABLE tw_model_blobs (
    sha256     TEXT PRIMARY KEY,
    size       BIGINT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    generation BIGINT NOT NULL DEFAULT nextval('tw_model_blob_generations')
);

CREATE TABLE tw_models (
    tenant TEXT NOT NULL,
    name   TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    record JSONB NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE INDEX tw_models_sha256 ON tw_models (sha256);
