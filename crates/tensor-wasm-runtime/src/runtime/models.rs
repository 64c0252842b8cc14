//! Models tenants store for `wasi-nn`'s `load-by-name`: `POST /models` and its siblings call
//! these. A model is checked by loading it (decoded, checked, folded: what an invocation would
//! do) before anything is written, counts against the tenant's stored-bytes quota, and is kept
//! by the function store (bytes content-addressed, then the record). Deleting one is
//! immediate for new loads; an invocation that already loaded it finishes with it (the parsed
//! model is in memory), so a delete never waits for or breaks a running invocation.
//!
//! The runtime keeps the records in memory (`NnShared::named`), read from the store when it
//! opens. Over a shared store, a replica that follows the change log brings them up to date
//! with [`Runtime::reload_model`] when another replica stores or deletes one; the store
//! refuses a name taken in its own write, so two replicas storing one name at once cannot
//! both succeed.

use std::sync::PoisonError;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Result, RuntimeError};
use crate::store::{sha256_hex, ModelRecord, WriteBounds};
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
            return Err(ModelRecord::name_taken(&spec.name));
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
        let bounds = WriteBounds {
            max_stored_bytes: Some(quota),
            ..WriteBounds::default()
        };
        self.inner.store.create_model(&record, bytes, &bounds)?;
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

    /// Re-reads `tenant`'s model `name` from the store and adds, replaces or drops this
    /// runtime's record of it to match, charging or releasing the tenant's stored bytes
    /// likewise: another replica of a shared store stored or deleted it (the change log's
    /// follower calls this). Read under the lock that serialises this runtime's own stores and
    /// deletes of models, so a reload never undoes one of them.
    ///
    /// # Errors
    /// The store's error when it cannot be read; the record kept here is then unchanged.
    pub fn reload_model(&self, tenant: &str, name: &str) -> Result<()> {
        let nn = &self.inner.nn;
        let _serial = nn.named_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let stored = self.inner.store.model(tenant, name)?;
        let key = (tenant.to_owned(), name.to_owned());
        let mut named = nn.named.write().unwrap_or_else(PoisonError::into_inner);
        if named.get(&key) == stored.as_ref() {
            return Ok(());
        }
        if let Some(old) = named.remove(&key) {
            self.inner.storage.release(tenant, old.bytes);
        }
        if let Some(record) = stored {
            tracing::debug!(tenant, model = name, "model reloaded from the store");
            self.inner.storage.charge(tenant, record.bytes);
            named.insert(key, record);
        } else {
            tracing::debug!(tenant, model = name, "model deleted in the store; dropped");
        }
        Ok(())
    }
}
