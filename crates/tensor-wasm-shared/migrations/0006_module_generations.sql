-- Version 6: a generation per module row, new from a sequence whenever the row is inserted.
-- A deploy stores a module in two short transactions around the upload, with no connection
-- held while it uploads: the first touches the row and reads its generation, the second checks
-- that the generation is unchanged (the orphan collector did not remove the row, and with it
-- the blob, in between) and stores the blob again when it changed.
CREATE SEQUENCE tw_module_generations;
ALTER TABLE tw_modules ADD COLUMN generation BIGINT NOT NULL
    DEFAULT nextval('tw_module_generations');
