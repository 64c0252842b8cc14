//! Tenant kernel compiles bounded per tenant: NVRTC for CUDA C++, the verifier and the fencing
//! rewrite for PTX. A compile runs on the invocation's own thread and cannot be interrupted
//! (NVRTC has no cancellation), so each tenant gets at most a configured number at a time
//! (`RuntimeConfig::max_compiles_per_tenant`, default [`DEFAULT_COMPILES_PER_TENANT`]): a
//! tenant whose invocations all compile distinct kernels uses that many cores for it,
//! whatever its concurrency. A further compile waits for one to finish, until its invocation's
//! deadline. Kernels found in the kernel cache need no permit.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Compiles one tenant may run at once, unless configured otherwise.
pub const DEFAULT_COMPILES_PER_TENANT: usize = 1;

/// The compiles running, by tenant.
#[derive(Debug)]
pub(crate) struct CompileGate {
    /// Compiles one tenant may run at once (at least 1).
    limit: usize,
    running: Mutex<HashMap<String, usize>>,
    freed: Condvar,
}

impl Default for CompileGate {
    fn default() -> Self {
        CompileGate::new(DEFAULT_COMPILES_PER_TENANT)
    }
}

/// A compile slot of one tenant, given back when dropped.
#[derive(Debug)]
pub(crate) struct CompilePermit<'g> {
    gate: &'g CompileGate,
    tenant: String,
}

impl CompileGate {
    /// A gate letting each tenant run `limit` compiles at once (0 counts as 1).
    pub(crate) fn new(limit: usize) -> Self {
        CompileGate {
            limit: limit.max(1),
            running: Mutex::default(),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        // A plain map never left half-updated: a poisoned lock still holds valid counts.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A compile slot of `tenant`, waiting for one until `deadline`; `None` once it passed.
    pub(crate) fn acquire(&self, tenant: &str, deadline: Instant) -> Option<CompilePermit<'_>> {
        let mut running = self.lock();
        loop {
            let count = running.entry(tenant.to_owned()).or_insert(0);
            if *count < self.limit {
                *count += 1;
                return Some(CompilePermit {
                    gate: self,
                    tenant: tenant.to_owned(),
                });
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            running = self
                .freed
                .wait_timeout(running, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Compiles `tenant` is running now.
    #[cfg(test)]
    fn running(&self, tenant: &str) -> usize {
        self.lock().get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for CompilePermit<'_> {
    fn drop(&mut self) {
        let mut running = self.gate.lock();
        if let Some(count) = running.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.tenant);
            }
        }
        drop(running);
        self.gate.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_tenant_compiles_one_at_a_time_and_others_do_not_wait() {
        let gate = CompileGate::default();
        let far = Instant::now() + Duration::from_secs(60);
        let first = gate.acquire("tn-a", far).unwrap();
        assert_eq!(gate.running("tn-a"), 1);
        // Another tenant is not held up.
        let other = gate.acquire("tn-b", far).unwrap();
        drop(other);
        // The same tenant waits until its deadline ...
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(gate.acquire("tn-a", soon).is_none());
        assert!(Instant::now() >= soon);
        // ... or until the running compile ends.
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| gate.acquire("tn-a", far).map(|_| Instant::now()));
            std::thread::sleep(Duration::from_millis(50));
            let released = Instant::now();
            drop(first);
            let got = waiter
                .join()
                .unwrap()
                .expect("a permit once the first is back");
            assert!(got >= released);
        });
        assert_eq!(gate.running("tn-a"), 0);
    }

    #[test]
    fn a_configured_limit_lets_that_many_compiles_run() {
        let gate = CompileGate::new(3);
        let far = Instant::now() + Duration::from_secs(60);
        let permits: Vec<_> = (0..3).map(|_| gate.acquire("tn-a", far).unwrap()).collect();
        assert_eq!(gate.running("tn-a"), 3);
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(gate.acquire("tn-a", soon).is_none(), "a fourth waits");
        drop(permits);
        // Zero is read as one: compiles are never refused outright.
        let one = CompileGate::new(0);
        let _first = one.acquire("tn-a", far).unwrap();
        assert!(one.acquire("tn-a", soon.max(Instant::now())).is_none());
    }
}
