-- Version 5: a version per tenant and per function record. A change to an existing record is
-- written only against the version its writer read (compare-and-set) and read again when
-- another writer came first, so no concurrent change is lost and no change re-creates a
-- deleted record (docs/scale-out.md, "Writes"). Records written before it start at 0.
ALTER TABLE tw_tenants ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tw_functions ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
