//! Integration tests of quota enforcement: each resource's limit, release on
//! guard drop (also under many threads), and the request-rate bucket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensor_wasm_tenant::{
    GpuIsolation, MemoryTenantStore, QuotaKind, Quotas, Resource, Tenant, TenantMetrics,
    TenantRegistry,
};
use tensor_wasm_test_support::wait::wait_until;

fn tenant_with(quotas: Quotas) -> (TenantRegistry, Arc<Tenant>) {
    let r = TenantRegistry::open(
        Arc::new(MemoryTenantStore::new()),
        TenantMetrics::unregistered().unwrap(),
    )
    .unwrap();
    let (info, _) = r
        .create_tenant("t", quotas, GpuIsolation::default())
        .unwrap();
    let tenant = r.lookup(&info.id).unwrap();
    (r, tenant)
}

fn small_quotas() -> Quotas {
    Quotas {
        max_functions: 2,
        max_module_bytes: 1000,
        max_live_instances: 3,
        max_guest_memory_bytes: 1 << 20,
        max_gpu_memory_bytes: 1 << 16,
        max_concurrent_invocations: 2,
        requests_per_second: 10,
        burst: 5,
        max_concurrent_deploys: 2,
        max_stored_bytes: Some(1 << 20),
    }
}

#[test]
fn summed_resources_enforce_their_limit_and_release_on_drop() {
    let (_r, t) = tenant_with(small_quotas());
    let cases = [
        (Resource::Functions, 1, 2, QuotaKind::Count),
        (Resource::LiveInstances, 1, 3, QuotaKind::Concurrency),
        (
            Resource::GuestMemoryBytes,
            1 << 18,
            1 << 20,
            QuotaKind::Concurrency,
        ),
        (
            Resource::GpuMemoryBytes,
            1 << 14,
            1 << 16,
            QuotaKind::Concurrency,
        ),
        (
            Resource::ConcurrentInvocations,
            1,
            2,
            QuotaKind::Concurrency,
        ),
        (Resource::ConcurrentDeploys, 1, 2, QuotaKind::Concurrency),
    ];
    for (resource, step, limit, kind) in cases {
        let mut guards = Vec::new();
        while t.usage(resource) + step <= limit {
            guards.push(t.acquire(resource, step).unwrap());
        }
        assert_eq!(t.usage(resource), limit, "{resource:?}");
        let err = t.acquire(resource, step).unwrap_err();
        assert_eq!(err.kind, kind, "{resource:?}");
        assert_eq!(err.limit, limit);
        assert_eq!(err.quota, resource.quota_name());
        assert_eq!(err.retry_after_s.is_some(), kind == QuotaKind::Concurrency);
        assert_eq!(t.usage(resource), limit, "a refusal consumes nothing");
        guards.pop();
        assert_eq!(t.usage(resource), limit - step);
        guards.push(t.acquire(resource, step).unwrap());
        drop(guards);
        assert_eq!(t.usage(resource), 0, "{resource:?}");
    }
}

#[test]
fn a_request_larger_than_the_whole_limit_is_a_size_error() {
    let (_r, t) = tenant_with(small_quotas());
    let err = t
        .acquire(Resource::GuestMemoryBytes, (1 << 20) + 1)
        .unwrap_err();
    assert_eq!(err.kind, QuotaKind::Size);
    assert_eq!(err.retry_after_s, None);
    let err = t.acquire(Resource::Functions, 3).unwrap_err();
    assert_eq!(err.kind, QuotaKind::Count);
    assert_eq!(t.usage(Resource::GuestMemoryBytes), 0);
    assert_eq!(t.usage(Resource::Functions), 0);
}

#[test]
fn module_bytes_are_checked_per_module_and_never_summed() {
    let (_r, t) = tenant_with(small_quotas());
    let a = t.acquire(Resource::ModuleBytes, 1000).unwrap();
    let b = t.acquire(Resource::ModuleBytes, 1000).unwrap();
    assert_eq!(a.amount(), 0);
    assert_eq!(t.usage(Resource::ModuleBytes), 0);
    let err = t.acquire(Resource::ModuleBytes, 1001).unwrap_err();
    assert_eq!(err.kind, QuotaKind::Size);
    assert_eq!(err.quota, "max_module_bytes");
    assert_eq!(err.limit, 1000);
    drop((a, b));
    assert_eq!(t.usage(Resource::ModuleBytes), 0);
}

#[test]
fn function_counts_persist_through_forget_and_set_usage() {
    let (_r, t) = tenant_with(small_quotas());
    // On restart the caller restores the count of existing functions.
    t.set_usage(Resource::Functions, 1);
    t.acquire(Resource::Functions, 1)
        .unwrap()
        .forget_into_usage();
    assert_eq!(t.usage(Resource::Functions), 2);
    assert_eq!(
        t.acquire(Resource::Functions, 1).unwrap_err().kind,
        QuotaKind::Count
    );
    // Deleting a function gives its slot back.
    t.release(Resource::Functions, 1);
    assert_eq!(t.usage(Resource::Functions), 1);
    let g = t.acquire(Resource::Functions, 1).unwrap();
    drop(g);
    assert_eq!(t.usage(Resource::Functions), 1);
}

#[test]
fn lowered_limits_apply_to_new_acquires_only() {
    let (r, t) = tenant_with(small_quotas());
    let held: Vec<_> = (0..3)
        .map(|_| t.acquire(Resource::LiveInstances, 1).unwrap())
        .collect();
    let patch = tensor_wasm_tenant::QuotasPatch {
        max_live_instances: Some(1),
        ..Default::default()
    };
    r.update(t.id(), &patch, None).unwrap();
    assert_eq!(t.usage(Resource::LiveInstances), 3);
    assert!(t.acquire(Resource::LiveInstances, 1).is_err());
    drop(held);
    assert_eq!(t.usage(Resource::LiveInstances), 0);
    let _one = t.acquire(Resource::LiveInstances, 1).unwrap();
    assert!(t.acquire(Resource::LiveInstances, 1).is_err());
}

#[test]
fn thirty_two_threads_never_exceed_limits_and_return_usage_to_zero() {
    let quotas = Quotas {
        max_concurrent_invocations: 8,
        max_guest_memory_bytes: 10 * 262_144,
        ..Quotas::default()
    };
    let (_r, t) = tenant_with(quotas);
    let granted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for i in 0..32u64 {
            let t = &t;
            let granted = &granted;
            s.spawn(move || {
                for n in 0..5_000u64 {
                    let Ok(slot) = t.acquire(Resource::ConcurrentInvocations, 1) else {
                        continue;
                    };
                    assert!(t.usage(Resource::ConcurrentInvocations) <= 8);
                    let amount = 262_144 * (1 + (i + n) % 3);
                    if let Ok(memory) = t.acquire(Resource::GuestMemoryBytes, amount) {
                        assert!(t.usage(Resource::GuestMemoryBytes) <= 10 * 262_144);
                        granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        drop(memory);
                    }
                    drop(slot);
                }
            });
        }
    });
    assert!(granted.into_inner() > 0);
    assert_eq!(t.usage(Resource::ConcurrentInvocations), 0);
    assert_eq!(t.usage(Resource::GuestMemoryBytes), 0);
}

#[test]
fn guards_release_when_a_holder_panics() {
    let (_r, t) = tenant_with(small_quotas());
    let t2 = Arc::clone(&t);
    let result = std::thread::spawn(move || {
        let _g = t2.acquire(Resource::ConcurrentInvocations, 2).unwrap();
        panic!("guest trapped");
    })
    .join();
    assert!(result.is_err());
    assert_eq!(t.usage(Resource::ConcurrentInvocations), 0);
}

#[test]
fn guards_outlive_the_tenant_handle_and_deletion() {
    let (r, t) = tenant_with(small_quotas());
    let g = t.acquire(Resource::LiveInstances, 2).unwrap();
    let id = t.id().to_owned();
    assert!(r.delete(&id).unwrap());
    drop(g);
    assert_eq!(t.usage(Resource::LiveInstances), 0);
}

#[test]
fn rate_allows_the_burst_then_refuses_with_retry_after_then_refills() {
    let (_r, t) = tenant_with(small_quotas()); // 10/s, burst 5
    let start = Instant::now();
    for _ in 0..5 {
        t.check_rate_at(start).unwrap();
    }
    let err = t.check_rate_at(start).unwrap_err();
    assert_eq!(err.kind, QuotaKind::Rate);
    assert_eq!(err.quota, "requests_per_second");
    assert_eq!(err.limit, 10);
    assert_eq!(err.retry_after_s, Some(1));
    // One token every 100 ms.
    assert!(t.check_rate_at(start + Duration::from_millis(99)).is_err());
    t.check_rate_at(start + Duration::from_millis(100)).unwrap();
    assert!(t.check_rate_at(start + Duration::from_millis(150)).is_err());
    // A full second refills the whole burst, no more.
    let later = start + Duration::from_secs(2);
    for _ in 0..5 {
        t.check_rate_at(later).unwrap();
    }
    assert!(t.check_rate_at(later).is_err());
}

#[test]
fn rate_refills_in_real_time() {
    let quotas = Quotas {
        requests_per_second: 50,
        burst: 2,
        ..Quotas::default()
    };
    let (_r, t) = tenant_with(quotas);
    t.check_rate().unwrap();
    t.check_rate().unwrap();
    assert!(t.check_rate().is_err());
    // 50 per second: a token comes back about 20 ms later, by the real clock.
    wait_until(
        Duration::from_secs(10),
        "the bucket refills a token",
        || t.check_rate().is_ok(),
    );
}

#[test]
fn retry_after_is_the_wait_for_one_token_and_zero_rate_is_unlimited() {
    let quotas = Quotas {
        requests_per_second: 1,
        burst: 1,
        ..Quotas::default()
    };
    let (_r, t) = tenant_with(quotas);
    let now = Instant::now();
    t.check_rate_at(now).unwrap();
    assert_eq!(t.check_rate_at(now).unwrap_err().retry_after_s, Some(1));
    assert!(t.check_rate_at(now + Duration::from_millis(999)).is_err());
    t.check_rate_at(now + Duration::from_secs(1)).unwrap();

    let unlimited = Quotas {
        requests_per_second: 0,
        burst: 0,
        ..Quotas::default()
    };
    let (_r2, free) = tenant_with(unlimited);
    for _ in 0..10_000 {
        free.check_rate_at(now).unwrap();
    }
}

#[test]
fn concurrent_rate_checks_admit_exactly_the_burst() {
    let quotas = Quotas {
        requests_per_second: 1,
        burst: 100,
        ..Quotas::default()
    };
    let (_r, t) = tenant_with(quotas);
    let now = Instant::now();
    let admitted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| {
                for _ in 0..50 {
                    if t.check_rate_at(now).is_ok() {
                        admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.into_inner(), 100);
}
