//! [`SharedStore`]: [`FunctionStore`] over PostgreSQL and an object store.

use std::sync::Arc;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, PutPayload};
use tensor_wasm_runtime::{
    is_valid_function_id, is_valid_snapshot_id, sha256_hex, FunctionRecord, FunctionStore,
    ModelRecord, Result, RuntimeError, SnapshotRecord, WriteBounds,
};

use crate::bridge::Bridge;
use crate::error::SharedStoreError;
use crate::metrics::SharedMetrics;
use crate::migrate::migrate;
use crate::orphans::lock_module;
use crate::pool::{Db, PoolOptions};

/// Where blobs go: an `s3://bucket[/prefix]` URL and how to reach the server.
#[derive(Debug, Clone, Default)]
pub struct BlobStoreConfig {
    /// `s3://bucket` or `s3://bucket/prefix`.
    pub url: String,
    /// The S3 endpoint (`http://host:port` for a server other than AWS); `None` takes
    /// `AWS_ENDPOINT` from the environment, or AWS itself.
    pub endpoint: Option<String>,
    /// Credentials and region; `None` takes `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
    /// `AWS_REGION` (or `AWS_DEFAULT_REGION`) from the environment.
    pub access_key_id: Option<String>,
    /// See [`BlobStoreConfig::access_key_id`].
    pub secret_access_key: Option<String>,
    /// See [`BlobStoreConfig::access_key_id`].
    pub region: Option<String>,
    /// Whether a plain `http://` endpoint is allowed (`AWS_ALLOW_HTTP=true` does the same).
    pub allow_http: bool,
}

impl BlobStoreConfig {
    fn build(&self) -> std::result::Result<Arc<dyn ObjectStore>, SharedStoreError> {
        let url = url::Url::parse(&self.url)
            .map_err(|e| SharedStoreError::Config(format!("blob store URL {}: {e}", self.url)))?;
        if url.scheme() != "s3" {
            return Err(SharedStoreError::Config(format!(
                "blob store URL {}: only s3:// is supported",
                self.url
            )));
        }
        let bucket = url
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| SharedStoreError::Config(format!("{} names no bucket", self.url)))?;
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(key) = &self.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &self.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        if self.allow_http {
            builder = builder.with_allow_http(true);
        }
        let s3: Arc<dyn ObjectStore> = Arc::new(builder.build()?);
        let prefix = url.path().trim_matches('/');
        Ok(if prefix.is_empty() {
            s3
        } else {
            Arc::new(PrefixStore::new(s3, prefix))
        })
    }
}

/// Runs `sql` with `params` in a transaction that also appends a change of `key` (kind
/// `kind`) to the change log when it changed a row; returns the rows changed.
pub(crate) async fn execute_logged(
    db: &Db,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    kind: &str,
    key: &str,
) -> Shared<u64> {
    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    let changed = tx.execute(sql, params).await?;
    if changed > 0 {
        log_change(&tx, kind, key).await?;
    }
    tx.commit().await?;
    Ok(changed)
}

/// Records in PostgreSQL, blobs in object storage (see the crate documentation).
pub struct SharedStore {
    pub(crate) bridge: Bridge,
    pub(crate) db: Arc<Db>,
    pub(crate) blobs: Arc<dyn ObjectStore>,
    pub(crate) metrics: Option<SharedMetrics>,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore").finish_non_exhaustive()
    }
}

pub(crate) type Shared<T> = std::result::Result<T, SharedStoreError>;

impl SharedStore {
    /// Connects to PostgreSQL at `database_url` (applying the schema migrations it lacks) and
    /// to the object store of `blobs`.
    ///
    /// # Errors
    /// [`SharedStoreError`] when either store is unreachable or misconfigured, or the schema is
    /// newer than this build.
    pub fn connect(database_url: &str, blobs: &BlobStoreConfig) -> Shared<Self> {
        Self::connect_with(database_url, blobs, PoolOptions::default())
    }

    /// [`SharedStore::connect`] with the database connections bounded by `pool`.
    ///
    /// # Errors
    /// As [`SharedStore::connect`].
    pub fn connect_with(
        database_url: &str,
        blobs: &BlobStoreConfig,
        pool: PoolOptions,
    ) -> Shared<Self> {
        let bridge = Bridge::new()?;
        let blobs = blobs.build()?;
        let db = Arc::new(Db::new(database_url, pool));
        let migrating = db.clone();
        bridge.run(async move {
            let mut client = migrating.client().await?;
            migrate(&mut client).await
        })?;
        Ok(Self {
            bridge,
            db,
            blobs,
            metrics: None,
        })
    }

    /// Records call latencies, errors and the followers' lag in `metrics` from now on.
    #[must_use]
    pub fn with_metrics(mut self, metrics: SharedMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Runs `call` on the store's runtime, timed into the metrics under `store`.
    pub(crate) fn timed<T, Fut>(&self, store: &str, call: Fut) -> Shared<T>
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = Shared<T>> + Send + 'static,
    {
        self.timed_as(store, "", call)
    }

    /// [`SharedStore::timed`] of a call about `what` (a table, an object key).
    pub(crate) fn timed_as<T, Fut>(&self, store: &str, what: &str, call: Fut) -> Shared<T>
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = Shared<T>> + Send + 'static,
    {
        let start = std::time::Instant::now();
        let span = crate::metrics::store_span(store, what);
        let _in = span.enter();
        let result = self.bridge.run(call);
        crate::metrics::store_span_done(&span, result.is_err());
        if let Some(metrics) = &self.metrics {
            metrics.observe(store, start.elapsed().as_secs_f64(), &result);
            metrics.set_connections(self.db.counts());
        }
        result
    }

    /// Runs the future `body` makes with the connection's holder on the store's runtime.
    pub(crate) fn run_db<T, F, Fut>(&self, body: F) -> Shared<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Db>) -> Fut,
        Fut: std::future::Future<Output = Shared<T>> + Send + 'static,
    {
        let (db, call) = (self.db.clone(), body(self.db.clone()));
        self.timed("database", async move { db.bounded(call).await })
    }

    /// [`SharedStore::run_db`] with the runtime's storage error naming `what`.
    pub(crate) fn with_db<T, F, Fut>(&self, what: &str, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Db>) -> Fut,
        Fut: std::future::Future<Output = Shared<T>> + Send + 'static,
    {
        let (db, call) = (self.db.clone(), body(self.db.clone()));
        self.timed_as("database", what, async move { db.bounded(call).await })
            .map_err(|e| e.into_runtime(what))
    }

    /// Runs the future `body` makes with the connections' holder on the store's runtime, with
    /// no bound on the whole (a call that lists or moves blobs bounds its own database calls
    /// with [`Db::bounded`]); errors name `what`.
    pub(crate) fn with_db_and_blobs<T, F, Fut>(&self, what: &str, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Db>) -> Fut,
        Fut: std::future::Future<Output = Shared<T>> + Send + 'static,
    {
        self.timed_as("objects", what, body(self.db.clone()))
            .map_err(|e| e.into_runtime(what))
    }

    /// Runs `f` while holding a PostgreSQL advisory lock that no other replica holds at the
    /// same time (on a connection of its own, so that a replica that dies releases it).
    ///
    /// # Errors
    /// [`SharedStoreError`] when the lock cannot be taken.
    pub fn exclusively<T>(&self, key: i64, f: impl FnOnce() -> T) -> Shared<T> {
        let db = self.db.clone();
        let client = self.bridge.run(async move {
            let client = db.connect(false).await?;
            client
                .execute("SELECT pg_advisory_lock($1)", &[&key])
                .await?;
            Ok::<_, SharedStoreError>(client)
        })?;
        let out = f();
        // Closing the session releases the lock as well; unlock explicitly all the same.
        let _ = self.bridge.run(async move {
            client
                .execute("SELECT pg_advisory_unlock($1)", &[&key])
                .await
        });
        Ok(out)
    }

    /// Runs the future `body` makes with the object store and `key` on the store's runtime;
    /// errors name the key.
    pub(crate) fn with_blobs<T, F, Fut>(&self, key: ObjectPath, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn ObjectStore>, ObjectPath) -> Fut,
        Fut: std::future::Future<Output = Shared<T>> + Send + 'static,
    {
        let what = key.to_string();
        self.timed_as("objects", &what, body(self.blobs.clone(), key))
            .map_err(|e| e.into_runtime(&what))
    }
}

pub(crate) fn module_key(sha256: &str) -> ObjectPath {
    ObjectPath::from(format!("modules/{sha256}.wasm"))
}

fn snapshot_key(function_id: &str, snapshot_id: &str) -> ObjectPath {
    ObjectPath::from(format!("snapshots/{function_id}/{snapshot_id}.twsnap"))
}

fn to_json<T: serde::Serialize>(record: &T) -> serde_json::Value {
    serde_json::to_value(record).expect("records serialize")
}

/// Decodes rows of (id, JSON record), naming each as `<what> record <id>` in errors.
pub(crate) fn decode_rows<T: serde::de::DeserializeOwned>(
    rows: Vec<tokio_postgres::Row>,
    what: &str,
) -> Shared<Vec<T>> {
    rows.into_iter()
        .map(|row| {
            let id: String = row.get(0);
            from_json(row.get(1), &format!("{what} record {id}"))
        })
        .collect()
}

pub(crate) fn from_json<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    what: &str,
) -> Shared<T> {
    serde_json::from_value(value).map_err(|e| SharedStoreError::Corrupt(format!("{what}: {e}")))
}

/// Takes the transaction-level lock of `tenant`'s records: deploys, snapshot captures and model
/// stores of one tenant take turns until they commit, so the counts and bytes they check are
/// the ones they write into, exactly across replicas.
pub(crate) async fn lock_tenant(tx: &tokio_postgres::Transaction<'_>, tenant: &str) -> Shared<()> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('tw_functions:' || $1))",
        &[&tenant],
    )
    .await?;
    Ok(())
}

/// The refusal of `adding` more bytes for `tenant` when they would take it past
/// `bounds.max_stored_bytes`: its functions' modules, its snapshots and its models, as their
/// records count them. Call it holding [`lock_tenant`].
pub(crate) async fn over_stored_bytes(
    tx: &tokio_postgres::Transaction<'_>,
    tenant: &str,
    adding: u64,
    bounds: &WriteBounds,
) -> Shared<Option<RuntimeError>> {
    let Some(limit) = bounds.max_stored_bytes else {
        return Ok(None);
    };
    let used: i64 = tx
        .query_one(
            "SELECT ((SELECT COALESCE(sum((record->>'module_size')::bigint), 0)
                      FROM tw_functions WHERE tenant = $1)
                   + (SELECT COALESCE(sum((record->>'stored_bytes')::bigint), 0)
                      FROM tw_snapshots WHERE record->>'tenant' = $1)
                   + (SELECT COALESCE(sum((record->>'bytes')::bigint), 0)
                      FROM tw_models WHERE tenant = $1))::bigint",
            &[&tenant],
        )
        .await?
        .get(0);
    let used = u64::try_from(used).unwrap_or(0);
    Ok(
        (used.saturating_add(adding) > limit).then_some(RuntimeError::StorageQuotaExceeded {
            limit,
            used,
            requested: adding,
        }),
    )
}

/// The refusal of a new function of `tenant` with `adding` bytes of module: the tenant has
/// `bounds.max_functions` functions already, or the bytes would take it past
/// `bounds.max_stored_bytes`. Exact when called holding [`lock_tenant`].
async fn new_function_refusal(
    tx: &tokio_postgres::Transaction<'_>,
    tenant: &str,
    adding: u64,
    bounds: &WriteBounds,
) -> Shared<Option<RuntimeError>> {
    if let Some(limit) = bounds.max_functions {
        let count: i64 = tx
            .query_one(
                "SELECT count(*) FROM tw_functions WHERE tenant = $1",
                &[&tenant],
            )
            .await?
            .get(0);
        if count as u64 >= limit {
            return Ok(Some(RuntimeError::FunctionQuotaExceeded {
                tenant: tenant.to_owned(),
                limit,
            }));
        }
    }
    over_stored_bytes(tx, tenant, adding, bounds).await
}

/// Key of the transaction-level advisory lock that orders the change log (ASCII "twchange").
const CHANGES_LOCK_KEY: i64 = 0x7477_6368_616e_6765;

/// Appends a change of `key` to the change log and wakes the listeners (on commit).
pub(crate) async fn log_change(
    tx: &tokio_postgres::Transaction<'_>,
    kind: &str,
    key: &str,
) -> Shared<()> {
    // Writers of the log take turns (until their commit), so sequence numbers become visible
    // in order: a follower that has read up to n never later sees a smaller one commit.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CHANGES_LOCK_KEY])
        .await?;
    let row = tx
        .query_one(
            "INSERT INTO tw_changes (kind, key) VALUES ($1, $2) RETURNING seq",
            &[&kind, &key],
        )
        .await?;
    let seq: i64 = row.get(0);
    tx.execute("SELECT pg_notify('tw_changes', $1)", &[&seq.to_string()])
        .await?;
    Ok(())
}

/// How many times [`FunctionStore::put_module`] stores a module that the orphan collector keeps
/// removing meanwhile (only a collector run with a grace period shorter than an upload can).
const MODULE_STORE_ATTEMPTS: usize = 3;

/// Touches module `sha256`'s row (inserting it with `size`) under the module's lock and returns
/// its generation.
async fn touch_module(db: &Db, sha256: &str, size: i64) -> Shared<i64> {
    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    lock_module(&tx, sha256).await?;
    let generation = tx
        .query_one(
            "INSERT INTO tw_modules (sha256, size) VALUES ($1, $2)
             ON CONFLICT (sha256) DO UPDATE SET created_at = now()
             RETURNING generation",
            &[&sha256, &size],
        )
        .await?
        .get(0);
    tx.commit().await?;
    Ok(generation)
}

impl FunctionStore for SharedStore {
    fn put_model(&self, record: &ModelRecord, bytes: &[u8]) -> Result<()> {
        self.store_model(record, bytes, &WriteBounds::default())
    }

    fn create_model(&self, record: &ModelRecord, bytes: &[u8], bounds: &WriteBounds) -> Result<()> {
        self.store_model(record, bytes, bounds)
    }

    fn model_bytes(&self, sha256: &str) -> Result<Vec<u8>> {
        self.read_model(sha256)
    }

    fn models(&self) -> Result<Vec<ModelRecord>> {
        self.model_records()
    }

    fn model(&self, tenant: &str, name: &str) -> Result<Option<ModelRecord>> {
        self.model_record(tenant, name)
    }

    fn delete_model(&self, tenant: &str, name: &str) -> Result<bool> {
        self.remove_model(tenant, name)
    }

    fn put_module(&self, bytes: &[u8]) -> Result<String> {
        let sha = sha256_hex(bytes);
        let size = bytes.len() as i64;
        let payload = Bytes::copy_from_slice(bytes);
        let (blobs, digest, db) = (self.blobs.clone(), sha.clone(), self.db.clone());
        // Two short transactions around the upload, none held while it runs (migration 6):
        // the row is touched under the module's lock, which the orphan collector takes too
        // (`orphans.rs`), and its generation read; after the upload the row is touched again
        // only if its generation is the same, that is, the collector did not remove the row,
        // and maybe the blob, in between. Otherwise all again.
        self.timed("objects", async move {
            let key = module_key(&digest);
            for _ in 0..MODULE_STORE_ATTEMPTS {
                let generation = db.bounded(touch_module(&db, &digest, size)).await?;
                match blobs.head(&key).await {
                    Ok(_) => {}
                    Err(object_store::Error::NotFound { .. }) => {
                        blobs.put(&key, PutPayload::from(payload.clone())).await?;
                    }
                    Err(e) => return Err(e.into()),
                }
                let kept = db
                    .bounded(async {
                        Ok(db
                            .client()
                            .await?
                            .execute(
                                "UPDATE tw_modules SET created_at = now()
                                 WHERE sha256 = $1 AND generation = $2",
                                &[&digest, &generation],
                            )
                            .await?)
                    })
                    .await?;
                if kept == 1 {
                    return Ok(());
                }
            }
            Err(SharedStoreError::Io(std::io::Error::other(format!(
                "module {digest} was collected as an orphan while it was stored, \
                 {MODULE_STORE_ATTEMPTS} times"
            ))))
        })
        .map_err(|e| e.into_runtime(module_key(&sha).as_ref()))?;
        Ok(sha)
    }

    fn module(&self, sha256: &str) -> Result<Vec<u8>> {
        let key = module_key(sha256);
        let expected = sha256.to_owned();
        self.with_blobs(key, |blobs, key| async move {
            let bytes = blobs.get(&key).await?.bytes().await?;
            if sha256_hex(&bytes) != expected {
                return Err(SharedStoreError::Corrupt(format!(
                    "module {expected} does not match its digest"
                )));
            }
            Ok(bytes.to_vec())
        })
    }

    fn put_function(&self, record: &FunctionRecord) -> Result<()> {
        let (id, tenant, json) = (record.id.clone(), record.tenant.clone(), to_json(record));
        self.with_db("tw_functions", |db| async move {
            execute_logged(
                &db,
                "INSERT INTO tw_functions (id, tenant, record) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record,
                     version = tw_functions.version + 1, updated_at = now()",
                &[&id, &tenant, &json],
                "function",
                &id,
            )
            .await
            .map(drop)
        })
    }

    fn check_new_function(&self, tenant: &str, adding: u64, bounds: &WriteBounds) -> Result<()> {
        if bounds.max_functions.is_none() && bounds.max_stored_bytes.is_none() {
            return Ok(());
        }
        let (tenant, bounds) = (tenant.to_owned(), *bounds);
        let refused = self.with_db("tw_functions", move |db| async move {
            let mut client = db.client().await?;
            let tx = client.transaction().await?;
            new_function_refusal(&tx, &tenant, adding, &bounds).await
        })?;
        refused.map_or(Ok(()), Err)
    }

    fn create_function(&self, record: &FunctionRecord, bounds: &WriteBounds) -> Result<()> {
        if bounds.max_functions.is_none() && bounds.max_stored_bytes.is_none() {
            return self.put_function(record);
        }
        let (id, tenant, json) = (record.id.clone(), record.tenant.clone(), to_json(record));
        let (bounds, adding) = (*bounds, record.module_size);
        let refused = self.with_db("tw_functions", move |db| async move {
            let mut client = db.client().await?;
            let tx = client.transaction().await?;
            lock_tenant(&tx, &tenant).await?;
            if let Some(refusal) = new_function_refusal(&tx, &tenant, adding, &bounds).await? {
                return Ok(Some(refusal));
            }
            tx.execute(
                "INSERT INTO tw_functions (id, tenant, record) VALUES ($1, $2, $3)",
                &[&id, &tenant, &json],
            )
            .await?;
            log_change(&tx, "function", &id).await?;
            tx.commit().await?;
            Ok(None)
        })?;
        refused.map_or(Ok(()), Err)
    }

    fn delete_function(&self, id: &str) -> Result<bool> {
        let id = id.to_owned();
        self.with_db("tw_functions", |db| async move {
            let deleted = execute_logged(
                &db,
                "DELETE FROM tw_functions WHERE id = $1",
                &[&id],
                "function",
                &id,
            )
            .await?;
            Ok(deleted > 0)
        })
    }

    fn replace_function(&self, old: &FunctionRecord, new: &FunctionRecord) -> Result<bool> {
        let id = old.id.clone();
        let current = self.with_db("tw_functions", |db| async move {
            let client = db.client().await?;
            let row = client
                .query_opt(
                    "SELECT record, version FROM tw_functions WHERE id = $1",
                    &[&id],
                )
                .await?;
            row.map(|row| {
                let record: FunctionRecord =
                    from_json(row.get(0), &format!("function record {id}"))?;
                Ok((record, row.get::<_, i64>(1)))
            })
            .transpose()
        })?;
        let Some((current, version)) = current else {
            return Err(RuntimeError::FunctionNotFound(old.id.clone()));
        };
        if current != *old {
            return Ok(false);
        }
        let (id, json) = (new.id.clone(), to_json(new));
        let written = self.with_db("tw_functions", |db| async move {
            execute_logged(
                &db,
                "UPDATE tw_functions SET record = $2, version = version + 1, updated_at = now()
                 WHERE id = $1 AND version = $3",
                &[&id, &json, &version],
                "function",
                &id,
            )
            .await
        })?;
        Ok(written == 1)
    }

    fn function(&self, id: &str) -> Result<Option<FunctionRecord>> {
        let id = id.to_owned();
        self.with_db("tw_functions", |db| async move {
            let client = db.client().await?;
            let row = client
                .query_opt("SELECT record FROM tw_functions WHERE id = $1", &[&id])
                .await?;
            row.map(|row| from_json(row.get(0), &format!("function record {id}")))
                .transpose()
        })
    }

    fn functions(&self) -> Result<Vec<FunctionRecord>> {
        self.with_db("tw_functions", |db| async move {
            let client = db.client().await?;
            let rows = client
                .query("SELECT id, record FROM tw_functions ORDER BY id", &[])
                .await?;
            decode_rows(rows, "function")
        })
    }

    fn put_snapshot(&self, record: &SnapshotRecord, pieces: &[&[u8]]) -> Result<()> {
        self.create_snapshot(record, pieces, &WriteBounds::default())
    }

    fn create_snapshot(
        &self,
        record: &SnapshotRecord,
        pieces: &[&[u8]],
        bounds: &WriteBounds,
    ) -> Result<()> {
        if !is_valid_function_id(&record.function_id) || !is_valid_snapshot_id(&record.id) {
            return Err(SharedStoreError::Config(format!(
                "`{}/{}` is not a snapshot id",
                record.function_id, record.id
            ))
            .into_runtime("tw_snapshots"));
        }
        let key = snapshot_key(&record.function_id, &record.id);
        let payload: PutPayload = pieces
            .iter()
            .map(|piece| Bytes::copy_from_slice(piece))
            .collect();
        self.with_blobs(key.clone(), |blobs, key| async move {
            blobs.put(&key, payload).await?;
            Ok(())
        })?;
        let (function_id, id, json) = (
            record.function_id.clone(),
            record.id.clone(),
            to_json(record),
        );
        let (tenant, adding, bounds) = (record.tenant.clone(), record.stored_bytes, *bounds);
        let created = i64::try_from(record.created_at_ms).unwrap_or(i64::MAX);
        let written = self.with_db("tw_snapshots", move |db| async move {
            let mut client = db.client().await?;
            let tx = client.transaction().await?;
            // The same per-tenant lock as deploys: the stored bytes both add to are exact.
            lock_tenant(&tx, &tenant).await?;
            if let Some(max) = bounds.max_snapshots_per_function {
                let count: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM tw_snapshots WHERE function_id = $1",
                        &[&function_id],
                    )
                    .await?
                    .get(0);
                if count as u64 >= max {
                    return Ok(Some(WriteBounds::too_many_snapshots(&function_id, max)));
                }
            }
            if let Some(refusal) = over_stored_bytes(&tx, &tenant, adding, &bounds).await? {
                return Ok(Some(refusal));
            }
            tx.execute(
                "INSERT INTO tw_snapshots (function_id, id, record, created_at_ms)
                 VALUES ($1, $2, $3, $4)",
                &[&function_id, &id, &json, &created],
            )
            .await?;
            tx.commit().await?;
            Ok(None)
        });
        match written {
            Ok(None) => Ok(()),
            Ok(Some(refusal)) => {
                // Refused: its bytes go again (a failure leaves an unreferenced blob, as a
                // crash would).
                let _ = self.delete_blob(key);
                Err(refusal)
            }
            Err(e) => Err(e),
        }
    }

    fn snapshot_bytes(&self, function_id: &str, snapshot_id: &str) -> Result<Option<Vec<u8>>> {
        let (function, id) = (function_id.to_owned(), snapshot_id.to_owned());
        let exists = self.with_db("tw_snapshots", |db| async move {
            let client = db.client().await?;
            let row = client
                .query_opt(
                    "SELECT 1 FROM tw_snapshots WHERE function_id = $1 AND id = $2",
                    &[&function, &id],
                )
                .await?;
            Ok(row.is_some())
        })?;
        if !exists {
            return Ok(None);
        }
        let key = snapshot_key(function_id, snapshot_id);
        self.with_blobs(key, |blobs, key| async move {
            match blobs.get(&key).await {
                Ok(got) => Ok(Some(got.bytes().await?.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn snapshots(&self, function_id: &str) -> Result<Vec<SnapshotRecord>> {
        let function = function_id.to_owned();
        self.with_db("tw_snapshots", |db| async move {
            let client = db.client().await?;
            let rows = client
                .query(
                    "SELECT id, record FROM tw_snapshots WHERE function_id = $1
                     ORDER BY created_at_ms, id",
                    &[&function],
                )
                .await?;
            decode_rows(rows, "snapshot")
        })
    }

    fn delete_snapshot(&self, function_id: &str, snapshot_id: &str) -> Result<bool> {
        let (function, id) = (function_id.to_owned(), snapshot_id.to_owned());
        let deleted = self.with_db("tw_snapshots", |db| async move {
            let client = db.client().await?;
            let n = client
                .execute(
                    "DELETE FROM tw_snapshots WHERE function_id = $1 AND id = $2",
                    &[&function, &id],
                )
                .await?;
            Ok(n > 0)
        })?;
        if deleted {
            self.delete_blob(snapshot_key(function_id, snapshot_id))?;
        }
        Ok(deleted)
    }

    fn delete_snapshots(&self, function_id: &str) -> Result<()> {
        let function = function_id.to_owned();
        let ids = self.with_db("tw_snapshots", |db| async move {
            let client = db.client().await?;
            let rows = client
                .query(
                    "DELETE FROM tw_snapshots WHERE function_id = $1 RETURNING id",
                    &[&function],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|row| row.get::<_, String>(0))
                .collect::<Vec<_>>())
        })?;
        for id in ids {
            self.delete_blob(snapshot_key(function_id, &id))?;
        }
        Ok(())
    }
}

impl SharedStore {
    /// Deletes a blob whose record is gone (a blob already missing is fine).
    fn delete_blob(&self, key: ObjectPath) -> Result<()> {
        self.with_blobs(key, |blobs, key| async move {
            match blobs.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
    }
}
