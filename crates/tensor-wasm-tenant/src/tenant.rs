//! `Tenant`, the live state of one tenant: its limits, its usage counters, its
//! request-rate bucket, and the `QuotaGuard` that gives usage back on drop.
//!
//! Everything on the request path is a handful of atomic operations; no lock is
//! taken by [`Tenant::check_rate`], [`Tenant::acquire`] or a guard's drop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::metrics::{TenantSeries, RATE_INDEX};
use crate::quota::RATE_QUOTA_NAME;
use crate::{GpuIsolation, QuotaError, QuotaKind, Quotas, Resource};

const RESOURCES: usize = Resource::ALL.len();

/// Live state of one tenant, shared as `Arc<Tenant>`.
///
/// Quota changes made through the registry apply to every holder at once.
pub struct Tenant {
    id: String,
    isolation: GpuIsolation,
    created_at_ms: u64,
    /// The raw-kernel capability (see [`Tenant::raw_ptx`]).
    raw_ptx: AtomicBool,
    profile: RwLock<Profile>,
    meter: Arc<Meter>,
}

/// The slowly changing, descriptive part of a tenant.
struct Profile {
    name: String,
    quotas: Quotas,
}

/// Counters shared between a tenant and its outstanding guards.
struct Meter {
    /// Indexed by `Resource as usize`.
    limits: [AtomicU64; RESOURCES],
    /// Indexed by `Resource as usize`; `ModuleBytes` stays 0.
    usage: [AtomicU64; RESOURCES],
    requests_per_second: AtomicU64,
    burst: AtomicU64,
    /// How many replicas share the tenant's rate and concurrency limits (1 alone); see
    /// [`Tenant::set_replica_share`].
    share: AtomicU64,
    bucket: RateBucket,
    deleted: AtomicBool,
    series: TenantSeries,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("id", &self.id)
            .field("name", &self.name())
            .field("isolation", &self.isolation)
            .finish_non_exhaustive()
    }
}

impl Tenant {
    pub(crate) fn new(
        id: String,
        name: String,
        quotas: Quotas,
        isolation: GpuIsolation,
        created_at_ms: u64,
        series: TenantSeries,
    ) -> Self {
        let meter = Meter {
            limits: std::array::from_fn(|_| AtomicU64::new(0)),
            usage: std::array::from_fn(|_| AtomicU64::new(0)),
            requests_per_second: AtomicU64::new(0),
            burst: AtomicU64::new(0),
            share: AtomicU64::new(1),
            bucket: RateBucket::new(),
            deleted: AtomicBool::new(false),
            series,
        };
        meter.store_limits(&quotas);
        Tenant {
            id,
            isolation,
            created_at_ms,
            raw_ptx: AtomicBool::new(false),
            profile: RwLock::new(Profile { name, quotas }),
            meter: Arc::new(meter),
        }
    }

    /// The tenant's id, `tn-` and 16 lowercase hex digits.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The tenant's current name.
    pub fn name(&self) -> String {
        self.profile().name.clone()
    }

    /// A snapshot of the tenant's current quotas.
    pub fn quotas(&self) -> Quotas {
        self.profile().quotas.clone()
    }

    /// How the tenant's GPU work is isolated.
    pub fn isolation(&self) -> GpuIsolation {
        self.isolation
    }

    /// Creation time, milliseconds since the Unix epoch.
    pub fn created_at_ms(&self) -> u64 {
        self.created_at_ms
    }

    /// Whether the admin granted the tenant the raw-kernel capability: its
    /// functions may load raw PTX or CUDA C++, which can address any device
    /// memory. Not granted by default; only the admin changes it
    /// ([`TenantRegistry::set_raw_ptx`](crate::TenantRegistry::set_raw_ptx)).
    pub fn raw_ptx(&self) -> bool {
        self.raw_ptx.load(Ordering::Acquire)
    }

    pub(crate) fn set_raw_ptx(&self, granted: bool) {
        self.raw_ptx.store(granted, Ordering::Release);
    }

    /// Whether the tenant was deleted from the registry. Holders of an
    /// `Arc<Tenant>` may use this to drop work of a deleted tenant.
    pub fn is_deleted(&self) -> bool {
        self.meter.deleted.load(Ordering::Relaxed)
    }

    /// The current limit of `resource`.
    pub fn limit(&self, resource: Resource) -> u64 {
        self.meter.limits[resource as usize].load(Ordering::Relaxed)
    }

    /// Current usage of `resource` (always 0 for `ModuleBytes`, which is not summed).
    pub fn usage(&self, resource: Resource) -> u64 {
        self.meter.usage[resource as usize].load(Ordering::Acquire)
    }

    /// Admits one request if the token bucket (`requests_per_second`, `burst`)
    /// has a token; otherwise says after how many seconds to retry.
    pub fn check_rate(&self) -> Result<(), QuotaError> {
        self.check_rate_at(Instant::now())
    }

    /// [`check_rate`](Self::check_rate) as of `now`, for callers that already
    /// read the clock (and for tests).
    pub fn check_rate_at(&self, now: Instant) -> Result<(), QuotaError> {
        let meter = &*self.meter;
        let rps = meter.requests_per_second.load(Ordering::Relaxed);
        if rps == 0 {
            return Ok(());
        }
        let burst = meter.burst.load(Ordering::Relaxed).max(1);
        let Err(wait) = meter.bucket.take(now, rps, burst) else {
            return Ok(());
        };
        meter.series.denied[RATE_INDEX].inc();
        Err(QuotaError {
            quota: RATE_QUOTA_NAME,
            limit: rps,
            kind: QuotaKind::Rate,
            retry_after_s: Some(ceil_secs(wait)),
        })
    }

    /// Adds `amount` to the usage of `resource` if the result stays within
    /// the resource's limit, and returns a guard that subtracts it again when
    /// dropped.
    ///
    /// `ModuleBytes` is checked per module: `amount` alone must not exceed the
    /// limit, nothing is added, and the guard gives nothing back.
    pub fn acquire(&self, resource: Resource, amount: u64) -> Result<QuotaGuard, QuotaError> {
        let index = resource as usize;
        let meter = &self.meter;
        let limit = meter.limits[index].load(Ordering::Relaxed);
        if amount > limit {
            let kind = match resource {
                Resource::Functions => QuotaKind::Count,
                _ => QuotaKind::Size,
            };
            return Err(self.deny(resource, limit, kind));
        }
        if resource == Resource::ModuleBytes || amount == 0 {
            return Ok(QuotaGuard::empty(resource));
        }
        let usage = &meter.usage[index];
        let mut current = usage.load(Ordering::Relaxed);
        loop {
            let next = match current.checked_add(amount) {
                Some(next) if next <= limit => next,
                _ => {
                    let kind = match resource {
                        Resource::Functions => QuotaKind::Count,
                        _ => QuotaKind::Concurrency,
                    };
                    return Err(self.deny(resource, limit, kind));
                }
            };
            match usage.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        meter.gauge_add(resource, amount, true);
        Ok(QuotaGuard {
            meter: Some(Arc::clone(meter)),
            resource,
            amount,
        })
    }

    /// Subtracts `amount` from the usage of `resource` (saturating at 0), for
    /// usage kept with [`QuotaGuard::forget_into_usage`], e.g. a function
    /// count when a function is deleted.
    pub fn release(&self, resource: Resource, amount: u64) {
        self.meter.release(resource, amount);
    }

    /// Sets the usage of `resource` to `value`, e.g. the number of functions a
    /// tenant owns when the runtime restarts. Ignored for `ModuleBytes`.
    pub fn set_usage(&self, resource: Resource, value: u64) {
        if resource == Resource::ModuleBytes {
            return;
        }
        let old = self.meter.usage[resource as usize].swap(value, Ordering::AcqRel);
        if value >= old {
            self.meter.gauge_add(resource, value - old, true);
        } else {
            self.meter.gauge_add(resource, old - value, false);
        }
    }

    fn profile(&self) -> std::sync::RwLockReadGuard<'_, Profile> {
        self.profile.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_profile(&self, name: &str, quotas: &Quotas) {
        let mut profile = self.profile.write().unwrap_or_else(|p| p.into_inner());
        self.meter.store_limits(quotas);
        profile.name = name.to_owned();
        profile.quotas = quotas.clone();
    }

    /// How many replicas share the tenant's rate and concurrency limits (1 alone).
    pub fn replica_share(&self) -> u64 {
        self.meter.share.load(Ordering::Relaxed)
    }

    /// Enforces `1/replicas` of the tenant's rate and concurrency limits here, rounded up:
    /// `requests_per_second`, `burst`, concurrent invocations, live instances and concurrent
    /// deploys. With `replicas` replicas each enforcing its share, the tenant gets at most
    /// `limit + replicas - 1` of each in all (docs/scale-out.md). The function count (exact in
    /// the store), the module size (per module) and guest and GPU memory (resources of each
    /// host, bounded per replica) are not divided. Holders admitted under a larger share keep
    /// what they hold.
    pub fn set_replica_share(&self, replicas: u64) {
        let profile = self.profile.write().unwrap_or_else(|p| p.into_inner());
        self.meter.share.store(replicas.max(1), Ordering::Relaxed);
        self.meter.store_limits(&profile.quotas);
    }

    pub(crate) fn mark_deleted(&self) {
        self.meter.deleted.store(true, Ordering::Relaxed);
    }

    fn deny(&self, resource: Resource, limit: u64, kind: QuotaKind) -> QuotaError {
        self.meter.series.denied[resource as usize].inc();
        let retry_after_s = match kind {
            QuotaKind::Concurrency => Some(1),
            _ => None,
        };
        QuotaError {
            quota: resource.quota_name(),
            limit,
            kind,
            retry_after_s,
        }
    }
}

impl Meter {
    /// Stores the limits of `quotas`, the shared ones divided by the replica share.
    fn store_limits(&self, quotas: &Quotas) {
        let share = self.share.load(Ordering::Relaxed).max(1);
        for resource in Resource::ALL {
            let limit = quotas.limit(resource);
            let limit = match resource {
                Resource::LiveInstances
                | Resource::ConcurrentInvocations
                | Resource::ConcurrentDeploys => limit.div_ceil(share),
                // Counted exactly by the store, checked per module, or a resource of the
                // host (memory): never divided.
                Resource::Functions
                | Resource::ModuleBytes
                | Resource::GuestMemoryBytes
                | Resource::GpuMemoryBytes => limit,
            };
            self.limits[resource as usize].store(limit, Ordering::Relaxed);
        }
        self.requests_per_second.store(
            u64::from(quotas.requests_per_second).div_ceil(share),
            Ordering::Relaxed,
        );
        self.burst
            .store(u64::from(quotas.burst).div_ceil(share), Ordering::Relaxed);
    }

    fn release(&self, resource: Resource, amount: u64) {
        if amount == 0 || resource == Resource::ModuleBytes {
            return;
        }
        let previous = self.usage[resource as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(amount))
            })
            .unwrap_or_else(|v| v);
        self.gauge_add(resource, amount.min(previous), false);
    }

    /// Mirrors a usage change of the resources that have a gauge.
    fn gauge_add(&self, resource: Resource, amount: u64, up: bool) {
        let gauge = match resource {
            Resource::LiveInstances => &self.series.live_instances,
            Resource::ConcurrentInvocations => &self.series.concurrent_invocations,
            Resource::GuestMemoryBytes => &self.series.guest_memory_bytes,
            _ => return,
        };
        let delta = i64::try_from(amount).unwrap_or(i64::MAX);
        gauge.add(if up { delta } else { -delta });
    }
}

fn ceil_secs(wait: Duration) -> u32 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

/// Usage of one resource held until drop.
///
/// Dropping the guard (on success, trap, timeout, or a dropped connection)
/// gives the amount back. [`forget_into_usage`](Self::forget_into_usage)
/// keeps it consumed instead.
#[must_use = "the usage is released as soon as the guard is dropped"]
pub struct QuotaGuard {
    meter: Option<Arc<Meter>>,
    resource: Resource,
    amount: u64,
}

impl std::fmt::Debug for QuotaGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaGuard")
            .field("resource", &self.resource)
            .field("amount", &self.amount)
            .finish()
    }
}

impl QuotaGuard {
    fn empty(resource: Resource) -> Self {
        QuotaGuard {
            meter: None,
            resource,
            amount: 0,
        }
    }

    /// The resource this guard holds.
    pub fn resource(&self) -> Resource {
        self.resource
    }

    /// The amount it gives back on drop.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// Keeps the amount consumed after the guard is gone; give it back later
    /// with [`Tenant::release`].
    pub fn forget_into_usage(mut self) {
        self.meter = None;
    }
}

impl Drop for QuotaGuard {
    fn drop(&mut self) {
        if let Some(meter) = self.meter.take() {
            meter.release(self.resource, self.amount);
        }
    }
}

/// A lock-free token bucket in its "theoretical arrival time" form: one
/// atomic holds the time at which the bucket would be full again.
struct RateBucket {
    origin: Instant,
    /// Nanoseconds after `origin`.
    full_at: AtomicU64,
}

impl RateBucket {
    fn new() -> Self {
        RateBucket {
            origin: Instant::now(),
            full_at: AtomicU64::new(0),
        }
    }

    /// Takes one token at `now`, or returns how long until one is available.
    fn take(&self, now: Instant, per_second: u64, burst: u64) -> Result<(), Duration> {
        let interval = 1_000_000_000 / per_second;
        let capacity = interval.saturating_mul(burst);
        let now = u64::try_from(now.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX);
        let mut full_at = self.full_at.load(Ordering::Relaxed);
        loop {
            let next = full_at.max(now).saturating_add(interval);
            let debt = next - now;
            if debt > capacity {
                return Err(Duration::from_nanos(debt - capacity));
            }
            match self.full_at.compare_exchange_weak(
                full_at,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => full_at = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TenantMetrics;

    fn tenant(quotas: Quotas) -> Tenant {
        let metrics = TenantMetrics::unregistered().unwrap();
        Tenant::new(
            "tn-00000000000000aa".into(),
            "t".into(),
            quotas,
            GpuIsolation::default(),
            0,
            metrics.series("tn-00000000000000aa"),
        )
    }

    #[test]
    fn ceil_secs_rounds_up_and_is_at_least_one() {
        assert_eq!(ceil_secs(Duration::ZERO), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }

    /// Each of three replicas enforces a third of the rate and concurrency limits, rounded
    /// up; the function count is not divided; one replica alone gets the whole limits back.
    #[test]
    fn a_replica_share_divides_rate_and_concurrency_limits() {
        let t = tenant(Quotas {
            max_concurrent_invocations: 4,
            requests_per_second: 3,
            burst: 3,
            max_functions: 10,
            ..Quotas::default()
        });
        t.set_replica_share(3);
        let held: Vec<_> = (0..2)
            .map(|_| t.acquire(Resource::ConcurrentInvocations, 1).unwrap())
            .collect();
        let denied = t.acquire(Resource::ConcurrentInvocations, 1).unwrap_err();
        assert_eq!(denied.limit, 2);
        assert_eq!(t.limit(Resource::Functions), 10);
        let now = Instant::now();
        assert!(t.check_rate_at(now).is_ok());
        assert!(t.check_rate_at(now).is_err(), "a burst of ceil(3/3) = 1");
        t.set_replica_share(1);
        assert_eq!(t.limit(Resource::ConcurrentInvocations), 4);
        let more: Vec<_> = (0..2)
            .map(|_| t.acquire(Resource::ConcurrentInvocations, 1).unwrap())
            .collect();
        assert_eq!(held.len() + more.len(), 4);
    }

    #[test]
    fn bucket_admits_burst_then_one_per_interval() {
        let bucket = RateBucket::new();
        let t0 = bucket.origin + Duration::from_secs(10);
        for _ in 0..4 {
            assert!(bucket.take(t0, 2, 4).is_ok());
        }
        let wait = bucket.take(t0, 2, 4).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(bucket.take(t0 + Duration::from_millis(499), 2, 4).is_err());
        assert!(bucket.take(t0 + Duration::from_millis(500), 2, 4).is_ok());
        assert!(bucket.take(t0 + Duration::from_millis(500), 2, 4).is_err());
        // After a long idle period the bucket is full again, not fuller.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..4 {
            assert!(bucket.take(later, 2, 4).is_ok());
        }
        assert!(bucket.take(later, 2, 4).is_err());
    }

    #[test]
    fn zero_burst_acts_as_one() {
        let t = tenant(Quotas {
            requests_per_second: 1,
            burst: 0,
            ..Quotas::default()
        });
        let now = Instant::now();
        assert!(t.check_rate_at(now).is_ok());
        let err = t.check_rate_at(now).unwrap_err();
        assert_eq!(err.kind, QuotaKind::Rate);
        assert_eq!(err.retry_after_s, Some(1));
    }

    #[test]
    fn set_usage_moves_the_gauge() {
        let t = tenant(Quotas::default());
        t.set_usage(Resource::LiveInstances, 5);
        assert_eq!(t.meter.series.live_instances.get(), 5);
        t.set_usage(Resource::LiveInstances, 2);
        assert_eq!(t.meter.series.live_instances.get(), 2);
        t.release(Resource::LiveInstances, 10);
        assert_eq!(t.usage(Resource::LiveInstances), 0);
        assert_eq!(t.meter.series.live_instances.get(), 0);
        t.set_usage(Resource::GuestMemoryBytes, 1 << 20);
        assert_eq!(t.meter.series.guest_memory_bytes.get(), 1 << 20);
        t.release(Resource::GuestMemoryBytes, 1 << 20);
        assert_eq!(t.meter.series.guest_memory_bytes.get(), 0);
        t.set_usage(Resource::ModuleBytes, 9);
        assert_eq!(t.usage(Resource::ModuleBytes), 0);
    }

    #[test]
    fn quota_changes_apply_to_existing_holders() {
        let t = tenant(Quotas {
            max_live_instances: 1,
            ..Quotas::default()
        });
        let g = t.acquire(Resource::LiveInstances, 1).unwrap();
        assert!(t.acquire(Resource::LiveInstances, 1).is_err());
        t.set_profile(
            "renamed",
            &Quotas {
                max_live_instances: 2,
                ..Quotas::default()
            },
        );
        let g2 = t.acquire(Resource::LiveInstances, 1).unwrap();
        assert_eq!(t.name(), "renamed");
        assert_eq!(t.quotas().max_live_instances, 2);
        drop((g, g2));
        assert_eq!(t.usage(Resource::LiveInstances), 0);
    }
}
