//! [`StorageLedger`]: bytes each tenant keeps on disk (modules and snapshots), reserved
//! atomically before a write and charged after it, so that concurrent requests cannot
//! together pass a tenant's stored-bytes quota.
//!
//! A deploy charges its module's size (per function, even when another function has the
//! same module: deleting either must not leave the other uncharged), a snapshot its stored
//! size. A write first takes a [`StorageReservation`] under the ledger's lock (refused when
//! the tenant's bytes in use, reservations included, plus the request would pass its
//! limit), then writes, then [`commits`](StorageReservation::commit) it; a failed write
//! drops the reservation, which gives the bytes back. Deletes release what they freed.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Result, RuntimeError};

/// Bytes each tenant keeps on disk: reserved under a lock before a write,
/// committed after it, released on failure and on deletes.
#[derive(Debug, Default)]
pub struct StorageLedger {
    /// Tenant id to bytes charged or reserved.
    used: Mutex<HashMap<String, u64>>,
}

/// Bytes reserved for a write in progress: dropped, they are given back; committed, they
/// stay charged to the tenant until released by a delete.
#[must_use = "dropping a reservation gives its bytes back"]
#[derive(Debug)]
pub struct StorageReservation<'a> {
    ledger: &'a StorageLedger,
    tenant: String,
    bytes: u64,
    committed: bool,
}

impl StorageLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        StorageLedger::default()
    }

    /// Charges `bytes` already on disk to `tenant` (when the runtime opens).
    pub(crate) fn charge(&self, tenant: &str, bytes: u64) {
        let mut used = self.used.lock().expect("lock");
        let slot = used.entry(tenant.to_owned()).or_default();
        *slot = slot.saturating_add(bytes);
    }

    /// Reserves `bytes` for `tenant` if its usage stays within `limit`, after `check` (run
    /// under the same lock, for other limits that must be checked atomically with the
    /// reservation, e.g. a count of snapshots) passes.
    ///
    /// # Errors
    /// What `check` returns; [`RuntimeError::StorageQuotaExceeded`] above the limit.
    pub fn reserve(
        &self,
        tenant: &str,
        bytes: u64,
        limit: u64,
        check: impl FnOnce() -> Result<()>,
    ) -> Result<StorageReservation<'_>> {
        let mut used = self.used.lock().expect("lock");
        check()?;
        let current = used.get(tenant).copied().unwrap_or(0);
        let after = current.saturating_add(bytes);
        if after > limit {
            return Err(RuntimeError::StorageQuotaExceeded {
                limit,
                used: current,
                requested: bytes,
            });
        }
        used.insert(tenant.to_owned(), after);
        Ok(StorageReservation {
            ledger: self,
            tenant: tenant.to_owned(),
            bytes,
            committed: false,
        })
    }

    /// Gives back `bytes` of `tenant` (a delete freed them).
    pub(crate) fn release(&self, tenant: &str, bytes: u64) {
        let mut used = self.used.lock().expect("lock");
        if let Some(slot) = used.get_mut(tenant) {
            *slot = slot.saturating_sub(bytes);
            if *slot == 0 {
                used.remove(tenant);
            }
        }
    }

    /// Bytes `tenant` keeps on disk, reservations in progress included.
    pub fn used(&self, tenant: &str) -> u64 {
        self.used
            .lock()
            .expect("lock")
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }
}

impl StorageReservation<'_> {
    /// The write succeeded: the bytes stay charged.
    pub fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for StorageReservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.ledger.release(&self.tenant, self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_until_dropped_and_commits_until_released() {
        let ledger = StorageLedger::new();
        ledger.charge("t", 10);
        let ok = || Ok(());
        let held = ledger.reserve("t", 60, 100, ok).unwrap();
        assert!(matches!(
            ledger.reserve("t", 31, 100, ok),
            Err(RuntimeError::StorageQuotaExceeded {
                limit: 100,
                used: 70,
                requested: 31
            })
        ));
        drop(held);
        assert_eq!(ledger.used("t"), 10);
        ledger.reserve("t", 90, 100, ok).unwrap().commit();
        assert_eq!(ledger.used("t"), 100);
        assert_eq!(ledger.used("other"), 0, "tenants are separate");
        ledger.release("t", 90);
        assert_eq!(ledger.used("t"), 10);
    }

    #[test]
    fn a_failed_check_reserves_nothing() {
        let ledger = StorageLedger::new();
        let refused = ledger.reserve("t", 5, 100, || {
            Err(RuntimeError::Conflict("too many".into()))
        });
        assert!(matches!(refused, Err(RuntimeError::Conflict(_))));
        assert_eq!(ledger.used("t"), 0);
    }
}
