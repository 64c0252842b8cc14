//! Collecting orphaned blobs: modules no function record names any more (their functions were
//! deleted, or a deploy failed after storing the module), snapshot images without a record
//! (a capture that failed or crashed between the image and its record) and model bytes no model
//! record names (their models were deleted, or a store was refused or failed after the upload).
//!
//! A module is collected only when its `tw_modules` row was last touched longer ago than the
//! grace period, under the same per-module transaction lock that `put_module` takes to touch
//! the row before its upload: a deploy either touched the row before the collector looked (the
//! row is young, the module is kept) or after it (the blob is stored again). `put_module` holds
//! no connection while it uploads; after the upload it touches the row again only if the row's
//! generation is the one it read (migration 6), and stores the blob again otherwise, so a
//! collector that ran meanwhile (an upload longer than the grace period) costs an upload, not
//! the module. The collector removes the row before the blob, in the transaction that holds
//! the lock. A deploy's record must follow its `put_module` within the grace period.
//! A snapshot image is collected when no record names it and the object is older than the
//! grace period (a capture writes its record right after its image).
//! Model bytes (`models.rs`) are collected as modules are, with their own index
//! (`tw_model_blobs`) and lock: when no model record names them and their row was untouched for
//! the grace period; a model's delete leaves them here.

use std::collections::HashSet;
use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use tensor_wasm_runtime::Result;

use crate::models::{model_key, MODEL_BYTES_LOCK};
use crate::pool::Db;
use crate::store::{module_key, Shared, SharedStore};

/// What [`SharedStore::collect_orphans`] found (and removed, unless it was a dry run).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Orphans {
    /// Modules no function names, past the grace period.
    pub modules: usize,
    /// Model bytes no model record names, past the grace period.
    pub models: usize,
    /// Snapshot images without a record, past the grace period.
    pub snapshots: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Every object under `prefix`, with its size and age in milliseconds.
async fn list(blobs: &dyn ObjectStore, prefix: &str) -> Shared<Vec<(ObjectPath, u64, i64)>> {
    let prefix = ObjectPath::from(prefix);
    let mut listing = blobs.list(Some(&prefix));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut objects = Vec::new();
    while let Some(meta) = std::future::poll_fn(|cx| listing.as_mut().poll_next(cx)).await {
        let meta = meta?;
        let age_ms = now - meta.last_modified.timestamp_millis();
        objects.push((meta.location, meta.size, age_ms));
    }
    Ok(objects)
}

impl SharedStore {
    /// How many objects object storage holds for this store (modules, snapshot images and
    /// model bytes), and their bytes: a listing, for operators' checks and tests.
    ///
    /// # Errors
    /// When object storage cannot be reached.
    pub fn blob_totals(&self) -> Result<(u64, u64)> {
        let blobs = self.blobs.clone();
        self.with_db_and_blobs("blobs", move |_db| async move {
            let (mut count, mut bytes) = (0u64, 0u64);
            for prefix in ["modules", "snapshots", "models"] {
                for (_, size, _) in list(blobs.as_ref(), prefix).await? {
                    count += 1;
                    bytes += size;
                }
            }
            Ok((count, bytes))
        })
    }

    /// Removes (or with `dry_run` only counts) the orphaned blobs older than `grace`.
    ///
    /// # Errors
    /// When either store cannot be reached or refuses a call; what was removed until then
    /// stays removed, and a second run continues.
    pub fn collect_orphans(&self, grace: Duration, dry_run: bool) -> Result<Orphans> {
        let blobs = self.blobs.clone();
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        self.with_db_and_blobs("orphans", move |db| async move {
            let mut found = Orphans::default();
            // Snapshots: an image without a record.
            let named: HashSet<String> = db
                .bounded(async {
                    Ok(db
                        .client()
                        .await?
                        .query("SELECT function_id || '/' || id FROM tw_snapshots", &[])
                        .await?)
                })
                .await?
                .iter()
                .map(|row| row.get(0))
                .collect();
            for (location, size, age_ms) in list(blobs.as_ref(), "snapshots").await? {
                let key = location.as_ref();
                let Some(name) = key
                    .strip_prefix("snapshots/")
                    .and_then(|k| k.strip_suffix(".twsnap"))
                else {
                    continue;
                };
                if named.contains(name) || age_ms < grace_ms {
                    continue;
                }
                if !dry_run {
                    delete(blobs.as_ref(), &location).await?;
                }
                found.snapshots += 1;
                found.bytes += size;
            }
            // Modules and model bytes: under their lock, unnamed and untouched for the grace
            // period.
            for kind in [&MODULES, &MODELS] {
                for (location, size, age_ms) in list(blobs.as_ref(), kind.prefix).await? {
                    let Some(sha) = location
                        .as_ref()
                        .strip_prefix(kind.prefix)
                        .and_then(|k| k.strip_prefix('/'))
                        .and_then(|k| k.strip_suffix(kind.suffix))
                        .map(str::to_owned)
                    else {
                        continue;
                    };
                    let collect =
                        collect_indexed(&db, blobs.as_ref(), kind, &sha, age_ms, grace_ms, dry_run);
                    if !db.bounded(collect).await? {
                        continue;
                    }
                    *(kind.count)(&mut found) += 1;
                    found.bytes += size;
                }
            }
            Ok(found)
        })
    }
}

/// Content-addressed blobs with an index table whose rows a store touches under a lock before
/// it uploads: modules and model bytes.
struct Indexed {
    /// The objects' prefix (`<prefix>/<sha256><suffix>`).
    prefix: &'static str,
    suffix: &'static str,
    /// The object key of a digest.
    key: fn(&str) -> ObjectPath,
    /// Takes the lock of the digest `$1` (until the transaction ends).
    lock: &'static str,
    /// Where [`Orphans`] counts them.
    count: fn(&mut Orphans) -> &mut usize,
    /// Whether a record names the digest `$1`, and for how many milliseconds its index row has
    /// been untouched (`NULL`: no row).
    lookup: &'static str,
    /// Deletes the index row of `$1`.
    forget: &'static str,
}

const MODULES: Indexed = Indexed {
    prefix: "modules",
    suffix: ".wasm",
    key: module_key,
    lock: MODULE_LOCK,
    count: |found| &mut found.modules,
    lookup: "SELECT
                 EXISTS (SELECT 1 FROM tw_functions
                         WHERE record->>'module_sha256' = $1),
                 (SELECT (EXTRACT(EPOCH FROM now() - created_at) * 1000)::BIGINT
                  FROM tw_modules WHERE sha256 = $1)",
    forget: "DELETE FROM tw_modules WHERE sha256 = $1",
};

const MODELS: Indexed = Indexed {
    prefix: "models",
    suffix: ".onnx",
    key: model_key,
    lock: MODEL_BYTES_LOCK,
    count: |found| &mut found.models,
    lookup: "SELECT
                 EXISTS (SELECT 1 FROM tw_models WHERE sha256 = $1),
                 (SELECT (EXTRACT(EPOCH FROM now() - created_at) * 1000)::BIGINT
                  FROM tw_model_blobs WHERE sha256 = $1)",
    forget: "DELETE FROM tw_model_blobs WHERE sha256 = $1",
};

/// Removes (or with `dry_run` only looks at) the blob `sha` of `kind`, `age_ms` old, under its
/// lock when no record names it and its row was untouched for `grace_ms`; returns whether it
/// was an orphan.
async fn collect_indexed(
    db: &Db,
    blobs: &dyn ObjectStore,
    kind: &Indexed,
    sha: &str,
    age_ms: i64,
    grace_ms: i64,
    dry_run: bool,
) -> Shared<bool> {
    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    tx.execute(kind.lock, &[&sha]).await?;
    let row = tx.query_one(kind.lookup, &[&sha]).await?;
    let named: bool = row.get(0);
    // No row: a blob stored by a write that crashed before its row; the object's own age
    // counts then.
    let touched_ms: i64 = row.get::<_, Option<i64>>(1).unwrap_or(age_ms);
    if named || touched_ms < grace_ms {
        return Ok(false);
    }
    if !dry_run {
        // The row first: a store that touched it before its upload waits for this
        // transaction, then finds its generation gone and stores the blob again.
        tx.execute(kind.forget, &[&sha]).await?;
        delete(blobs, &(kind.key)(sha)).await?;
        tx.commit().await?;
    }
    Ok(true)
}

/// Takes the transaction-level lock of module `$1` (see the module documentation).
const MODULE_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('tw_modules:' || $1))";

/// Takes the transaction-level lock of module `sha256` ([`MODULE_LOCK`]).
pub(crate) async fn lock_module(tx: &tokio_postgres::Transaction<'_>, sha256: &str) -> Shared<()> {
    tx.execute(MODULE_LOCK, &[&sha256]).await?;
    Ok(())
}

async fn delete(blobs: &dyn ObjectStore, location: &ObjectPath) -> Shared<()> {
    match blobs.delete(location).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
