-- Tenants (their JSON records: quotas, capability, hashed tokens) and the administrator's
-- hashed token, shared by every replica. Changes are announced in tw_changes
-- (kind 'tenant' with the tenant id, kind 'admin').
CREATE TABLE tw_tenants (
    id         TEXT PRIMARY KEY,
    record     JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE tw_admin (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    record    JSONB NOT NULL
);
