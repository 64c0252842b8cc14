//! Models tenants store for `wasi-nn`'s `load-by-name`: `POST /models` and its siblings call
//! these. A model is checked by loading it (decoded, checked, folded: what an invocation would
//! do) before anything is written, counts against the tenant's stored-bytes quota, and is kept
//! by the function store (bytes content-addressed, then the record). Deleting one is
//! immediate for new loads; an invocation that already loaded it finishes with it (the parsed
//! model is in memory), so a delete never waits for or breaks a running invocation.

use std::sync::PoisonError;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Result, RuntimeError};
use crate::store::{sha256_hex, ModelRecord};
use crate::Runtime;

/// What `put_model` stores, and the quota it counts against.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The owning tenant.
    pub tenant: String,
    /// The model's name: 1 to 128 of `A-Z a-z 0-9 . _ -`.
    pub name: String,
    /// The tenant's stored-bytes quota (`None`: the server's `max_stored_bytes_per_tenant`).
    pub max_stored_bytes: Option<u64>,
}

/// Whether `name` is a model name (it appears in URLs and in guests' `load-by-name`).
pub fn is_valid_model_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// How long checking an uploaded model may take.
const CHECK_DEADLINE: Duration = Duration::from_secs(60);

impl Runtime {
    /// Stores `bytes` as `spec.tenant`'s model `spec.name`, after loading it (so a model no
    /// invocation could run is refused here, with the executor's code); a name already taken
    /// is a conflict.
    pub fn put_model(&self, bytes: &[u8], spec: ModelSpec) -> Result<ModelRecord> {
        if !is_valid_model_name(&spec.name) {
            return Err(RuntimeError::InvalidConfig(
                "a model name is 1 to 128 of A-Z a-z 0-9 . _ -".into(),
            ));
        }
        let nn = &self.inner.nn;
        nn.model(bytes, Instant::now() + CHECK_DEADLINE)
            .map_err(|e| RuntimeError::InvalidOnnx(e.to_string()))?;
        let _serial = nn.named_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (spec.tenant.clone(), spec.name.clone());
        if nn
            .named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&key)
        {
            return Err(RuntimeError::Conflict(format!(
                "a model named `{}` exists; delete it first",
                spec.name
            )));
        }
        let record = ModelRecord {
            tenant: spec.tenant.clone(),
            name: spec.name.clone(),
            sha256: sha256_hex(bytes),
            bytes: bytes.len() as u64,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        let quota = spec
            .max_stored_bytes
            .unwrap_or(self.inner.config.max_stored_bytes_per_tenant);
        let reservation = self
            .inner
            .storage
            .reserve(&spec.tenant, record.bytes, quota, || Ok(()))?;
        self.inner.store.put_model(&record, bytes)?;
        reservation.commit();
        nn.named
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, record.clone());
        Ok(record)
    }

    /// `tenant`'s models, by name.
    pub fn models(&self, tenant: &str) -> Vec<ModelRecord> {
        let mut models: Vec<ModelRecord> = self
            .inner
            .nn
            .named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|r| r.tenant == tenant)
            .cloned()
            .collect();
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }

    /// `tenant`'s model `name`.
    pub fn model(&self, tenant: &str, name: &str) -> Result<ModelRecord> {
        self.inner
            .nn
            .named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(tenant.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| RuntimeError::ModelNotFound(name.to_owned()))
    }

    /// Deletes `tenant`'s model `name` (see the module docs for invocations using it).
    pub fn delete_model(&self, tenant: &str, name: &str) -> Result<()> {
        let nn = &self.inner.nn;
        let _serial = nn.named_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let record = self.model(tenant, name)?;
        self.inner.store.delete_model(tenant, name)?;
        nn.named
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(tenant.to_owned(), name.to_owned()));
        self.inner.storage.release(tenant, record.bytes);
        Ok(())
    }
}
