//! Bringing one cached function record up to date with the store, for a replica that follows
//! a shared store's change log (`tensor-wasm-shared`): another replica deployed, changed or
//! deleted the function.

use std::sync::Arc;

use crate::error::Result;
use crate::function_entry::FunctionEntry;
use crate::Runtime;

impl Runtime {
    /// Re-reads function `id` from the store and replaces, adds or drops its cached entry to
    /// match; returns the tenant the function belongs to (or belonged to, when it was
    /// dropped), `None` when neither the store nor this runtime knows it. The caller uses the
    /// tenant to recount its functions.
    ///
    /// The store is read under the lock that serialises this runtime's own record changes, so
    /// a reload never puts back an older record over a change this runtime just made. The
    /// module cache and compiled artifacts are keyed by module hash and stay valid; the
    /// per-host snapshot images of a dropped function are removed. Tenants' stored-bytes
    /// ledgers are not adjusted (quotas across replicas belong to the shared store).
    ///
    /// # Errors
    /// The store's error when it cannot be read; the cached entry is then unchanged.
    pub fn reload_function(&self, id: &str) -> Result<Option<String>> {
        let _lock = self.inner.record_lock.lock().expect("lock");
        let record = self.inner.store.function(id)?;
        let mut functions = self.inner.functions.write().expect("lock");
        match record {
            Some(record) => {
                let tenant = record.tenant.clone();
                if functions.get(id).is_none_or(|entry| entry.record != record) {
                    tracing::debug!(function = %id, "reloaded from the store");
                    functions.insert(id.to_owned(), Arc::new(FunctionEntry::new(record)));
                }
                Ok(Some(tenant))
            }
            None => {
                let removed = functions.remove(id);
                drop(functions);
                let tenant = removed.as_ref().map(|entry| entry.record.tenant.clone());
                if let Some(entry) = removed {
                    tracing::debug!(function = %id, "deleted in the store; dropped");
                    if let Some(snapshot) = &entry.record.start_from_snapshot {
                        let _ = std::fs::remove_file(self.local_path(snapshot));
                    }
                    self.forget_module_if_unused(&entry.record.module_sha256);
                }
                Ok(tenant)
            }
        }
    }
}
