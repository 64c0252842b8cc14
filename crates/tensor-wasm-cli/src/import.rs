//! `tensor-wasm import-data-dir`: moves a single-node data dir into the shared store, so that
//! a deployment can grow from one process to replicas without redeploying anything.
//!
//! Copied: the admin token and every tenant with its hashed tokens and quotas, every function
//! record with its module, and every snapshot with its portable image. The data dir is only
//! read. Each write is an upsert or skipped when present, so a run that stopped half-way is
//! finished by running it again. Async jobs are not copied (finished ones are history, and
//! jobs unfinished when a server stops fail anyway). Compiled artifacts and local snapshot
//! images are per-host caches that every replica rebuilds.
//!
//! It refuses a store that holds state of another origin: an admin token that differs from
//! the data dir's, or a tenant the data dir does not have. Merging two installations is not
//! what this command does.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{bail, Context as _};
use tensor_wasm_runtime::{FsFunctionStore, FunctionStore};
use tensor_wasm_shared::{BlobStoreConfig, SharedStore};
use tensor_wasm_tenant::{FsTenantStore, TenantStore};

/// What an import copied (and what was there already).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub tenants: usize,
    pub functions: usize,
    pub snapshots: usize,
    /// Snapshots the store had already (an earlier run).
    pub snapshots_present: usize,
}

/// Copies the state of `data_dir` into the shared store at `store` (PostgreSQL URL) and
/// `blob_store` (`s3://bucket/prefix`; endpoint and credentials from the `AWS_*` environment).
pub fn import_data_dir(data_dir: &Path, store: &str, blob_store: &str) -> anyhow::Result<()> {
    let imported = run(data_dir, store, blob_store)?;
    println!(
        "imported {}: {} tenant(s), {} function(s), {} snapshot(s) ({} already present)",
        data_dir.display(),
        imported.tenants,
        imported.functions,
        imported.snapshots,
        imported.snapshots_present
    );
    Ok(())
}

fn run(data_dir: &Path, store: &str, blob_store: &str) -> anyhow::Result<Imported> {
    if !data_dir.join("functions").is_dir() && !data_dir.join("tenants").is_dir() {
        bail!(
            "{} is not a tensor-wasm data dir (it has neither functions/ nor tenants/)",
            data_dir.display()
        );
    }
    let functions = FsFunctionStore::open(data_dir)
        .with_context(|| format!("opening the data dir {}", data_dir.display()))?;
    let tenants = FsTenantStore::open(data_dir)
        .with_context(|| format!("opening the tenants of {}", data_dir.display()))?;
    let blobs = BlobStoreConfig {
        url: blob_store.to_owned(),
        ..BlobStoreConfig::default()
    };
    let shared = SharedStore::connect(store, &blobs).context("connecting to the shared store")?;

    // Tenants and the admin first: a function record never names a tenant the store lacks.
    let admin = tenants.admin()?;
    let local_tenants = tenants.all()?;
    let ours: HashSet<&str> = local_tenants.iter().map(|t| t.id.as_str()).collect();
    if let (Some(theirs), Some(mine)) = (shared.admin()?, &admin) {
        if &theirs != mine {
            bail!(
                "the shared store has another admin token than {}: it holds another \
                 installation's state, and this command does not merge installations",
                data_dir.display()
            );
        }
    }
    if let Some(other) = shared
        .all()?
        .into_iter()
        .find(|t| !ours.contains(t.id.as_str()))
    {
        bail!(
            "the shared store has tenant {} ({}), which {} does not: it holds another \
             installation's state, and this command does not merge installations",
            other.id,
            other.name,
            data_dir.display()
        );
    }
    if let Some(admin) = &admin {
        shared.put_admin(admin)?;
    }
    for tenant in &local_tenants {
        shared.put(tenant)?;
    }

    let mut imported = Imported {
        tenants: local_tenants.len(),
        ..Imported::default()
    };
    for record in functions.functions()? {
        let module = functions
            .module(&record.module_sha256)
            .with_context(|| format!("reading the module of function {}", record.id))?;
        shared.put_module(&module)?;
        shared.put_function(&record)?;
        imported.functions += 1;
        let present: HashSet<String> = shared
            .snapshots(&record.id)?
            .into_iter()
            .map(|s| s.id)
            .collect();
        for snapshot in functions.snapshots(&record.id)? {
            if present.contains(&snapshot.id) {
                imported.snapshots_present += 1;
                continue;
            }
            let Some(bytes) = functions.snapshot_bytes(&record.id, &snapshot.id)? else {
                tracing::warn!(function = %record.id, snapshot = %snapshot.id,
                    "a snapshot record without its image; not imported");
                continue;
            };
            shared.put_snapshot(&snapshot, &[&bytes])?;
            imported.snapshots += 1;
        }
    }
    Ok(imported)
}
