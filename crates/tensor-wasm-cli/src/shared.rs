//! `serve` over the shared store (`--store postgres://… --blob-store s3://…`) or the
//! embedded one, and `tensor-wasm migrate`.
//!
//! With the shared store, function records, snapshots, models, tenants and the admin token
//! live in PostgreSQL and object storage (`tensor-wasm-shared`), async jobs in its shared
//! queue; the data dir keeps the per-host caches. The registry is opened and bootstrapped
//! under an advisory lock, so replicas starting together bootstrap once, and a follower keeps
//! this replica's cached functions, models and tenants in step with the change log.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use tensor_wasm_runtime::{FsFunctionStore, FunctionStore, Runtime};
use tensor_wasm_shared::{
    BlobStoreConfig, ChangeFollower, FollowOptions, PoolOptions, SharedMetrics, SharedStore,
    BOOTSTRAP_LOCK_KEY,
};
use tensor_wasm_tenant::{
    Bootstrap, FsTenantStore, Resource, TenantError, TenantMetrics, TenantRegistry, TenantStore,
};

/// How often a replica writes its heartbeat and recounts the live replicas.
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A replica whose heartbeat is older than this is not counted as live.
pub const LIVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Where `serve` keeps its state.
pub struct Stores {
    pub functions: Arc<dyn FunctionStore>,
    tenants: Arc<dyn TenantStore>,
    /// The shared store and the change-log position read before anything was loaded.
    shared: Option<(Arc<SharedStore>, i64)>,
}

impl Stores {
    /// The embedded stores in `data_dir`, or the shared store when `store` (a PostgreSQL URL)
    /// and `blob_store` (an `s3://` URL; endpoint and credentials from the `AWS_*`
    /// environment) are given. Blocking: call it on a blocking thread.
    pub fn open(
        data_dir: &Path,
        store: Option<&str>,
        blob_store: Option<&str>,
        pool: PoolOptions,
        registry: &prometheus::Registry,
    ) -> anyhow::Result<Self> {
        let (Some(store), Some(blob_store)) = (store, blob_store) else {
            let functions = FsFunctionStore::open(data_dir)
                .with_context(|| format!("opening the data directory {}", data_dir.display()))?;
            let tenants = FsTenantStore::open(data_dir)
                .with_context(|| format!("opening the tenant store in {}", data_dir.display()))?;
            return Ok(Self {
                functions: Arc::new(functions),
                tenants: Arc::new(tenants),
                shared: None,
            });
        };
        let blobs = BlobStoreConfig {
            url: blob_store.to_owned(),
            ..BlobStoreConfig::default()
        };
        let metrics = SharedMetrics::register(registry)?;
        let shared = Arc::new(
            SharedStore::connect_with(store, &blobs, pool)
                .context("connecting to the shared store")?
                .with_metrics(metrics),
        );
        let after = shared
            .latest_change()
            .context("reading the shared store's change log")?;
        tracing::info!(blob_store, after, "using the shared store");
        Ok(Self {
            functions: shared.clone(),
            tenants: shared.clone(),
            shared: Some((shared, after)),
        })
    }

    /// With the shared store, the shared queue of asynchronous jobs.
    pub fn job_queue(&self) -> Option<Arc<dyn tensor_wasm_api::JobQueue>> {
        let (shared, _) = self.shared.as_ref()?;
        Some(shared.clone())
    }

    /// With the shared store, counts this replica in (`name`), sets the tenants' replica share
    /// from the live replicas, and keeps doing so every [`HEARTBEAT_EVERY`] in a task of the
    /// current runtime. Call it before serving: a replica that served before its first count
    /// would enforce whole limits beside the others' shares.
    pub async fn join(&self, name: &str, tenants: &Arc<TenantRegistry>) -> anyhow::Result<()> {
        let Some((shared, _)) = &self.shared else {
            return Ok(());
        };
        let beat = {
            let (shared, name) = (shared.clone(), name.to_owned());
            move || shared.heartbeat(&name, LIVE_WITHIN)
        };
        let live = tokio::task::spawn_blocking(beat.clone())
            .await?
            .context("writing this replica's heartbeat to the shared store")?;
        tenants.set_replicas(live);
        let tenants = tenants.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match tokio::task::spawn_blocking(beat.clone()).await {
                    Ok(Ok(live)) => tenants.set_replicas(live),
                    // The share stays as last counted while the database is away.
                    Ok(Err(e)) => tracing::debug!(error = %e, "heartbeat failed"),
                    Err(_) => return,
                }
            }
        });
        Ok(())
    }

    /// With the shared store, removes this replica's heartbeat (it is stopping).
    pub fn leave(&self, name: &str) {
        if let Some((shared, _)) = &self.shared {
            if let Err(e) = shared.leave(name) {
                tracing::warn!(error = %e, "could not remove this replica's heartbeat");
            }
        }
    }

    /// Opens the tenant registry and bootstraps it on the first start (under the shared
    /// store's bootstrap lock, so that replicas starting together bootstrap once).
    pub fn open_registry(
        &self,
        metrics: TenantMetrics,
    ) -> anyhow::Result<(TenantRegistry, Option<Bootstrap>)> {
        let open = || -> Result<_, TenantError> {
            let registry = TenantRegistry::open(self.tenants.clone(), metrics)?;
            let bootstrap = registry.bootstrap()?;
            Ok((registry, bootstrap))
        };
        let opened = match &self.shared {
            Some((shared, _)) => shared
                .exclusively(BOOTSTRAP_LOCK_KEY, open)
                .context("taking the shared store's bootstrap lock")?,
            None => open(),
        };
        opened.context("opening the tenant registry")
    }

    /// With the shared store, starts following its change log from where it stood before
    /// anything was loaded: functions, models and tenants changed by other replicas are
    /// reloaded here.
    pub fn follow(
        &self,
        runtime: &Runtime,
        tenants: &Arc<TenantRegistry>,
    ) -> Option<ChangeFollower> {
        let (shared, after) = self.shared.as_ref()?;
        let (runtime, tenants) = (runtime.clone(), tenants.clone());
        Some(shared.follow_changes(
            *after,
            FollowOptions::default(),
            Arc::new(move |change| {
                match change.kind.as_str() {
                    "function" => {
                        let tenant = runtime
                            .reload_function(&change.key)
                            .map_err(|e| e.to_string())?;
                        // The tenant's function count follows what the replicas hold together.
                        if let Some(live) = tenant.as_deref().and_then(|t| tenants.lookup(t)) {
                            let owned = runtime.functions_of(live.id()).len() as u64;
                            live.set_usage(Resource::Functions, owned);
                        }
                        Ok(())
                    }
                    "model" => {
                        let (tenant, name) = change
                            .model()
                            .ok_or_else(|| format!("model change key `{}`", change.key))?;
                        runtime
                            .reload_model(tenant, name)
                            .map_err(|e| e.to_string())
                    }
                    "tenant" => tenants
                        .reload_tenant(&change.key)
                        .map_err(|e| e.to_string()),
                    "admin" => tenants.reload_admin().map_err(|e| e.to_string()),
                    other => {
                        tracing::warn!(
                            kind = other,
                            "unknown change kind in the change log; skipped"
                        );
                        Ok(())
                    }
                }
            }),
        ))
    }
}

/// `tensor-wasm migrate`: applies the shared store's schema migrations and says which.
pub fn migrate(store: &str) -> anyhow::Result<()> {
    let applied = tensor_wasm_shared::migrate::run(store).context("migrating the shared store")?;
    if applied.is_empty() {
        println!(
            "schema is current (version {})",
            tensor_wasm_shared::migrate::SCHEMA_VERSION
        );
    } else {
        for version in applied {
            println!("applied migration {version}");
        }
    }
    Ok(())
}

/// `tensor-wasm collect-orphans`: removes (or counts) the shared store's orphaned blobs older
/// than `grace_s` seconds and says how many.
pub fn collect_orphans(
    store: &str,
    blob_store: &str,
    grace_s: u64,
    dry_run: bool,
) -> anyhow::Result<()> {
    let blobs = BlobStoreConfig {
        url: blob_store.to_owned(),
        ..BlobStoreConfig::default()
    };
    let shared = SharedStore::connect(store, &blobs).context("connecting to the shared store")?;
    let found = shared
        .collect_orphans(std::time::Duration::from_secs(grace_s), dry_run)
        .context("collecting orphaned blobs")?;
    println!(
        "{} {} module(s), {} snapshot image(s) and {} model(s), {} bytes",
        if dry_run { "would remove" } else { "removed" },
        found.modules,
        found.snapshots,
        found.models,
        found.bytes
    );
    Ok(())
}
