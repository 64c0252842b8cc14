//! Criterion benches of the per-request tenant path.
//!
//! Group `tenant_registry`:
//! - `lookup/{1,16,256}`: [`TenantRegistry::lookup`] of an existing id in a
//!   registry holding that many tenants (target: under 100 ns).
//! - `consume_release/256KiB`: [`Tenant::acquire`] of 262144 bytes of
//!   `GuestMemoryBytes` and the guard's drop (target: under 200 ns).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tensor_wasm_tenant::{
    GpuIsolation, MemoryTenantStore, Quotas, Resource, TenantMetrics, TenantRegistry,
};

fn registry_with(tenants: usize) -> (TenantRegistry, Vec<String>) {
    let registry = TenantRegistry::open(
        Arc::new(MemoryTenantStore::new()),
        TenantMetrics::unregistered().expect("metrics"),
    )
    .expect("registry");
    let ids = (0..tenants)
        .map(|i| {
            registry
                .create_tenant(&format!("t{i}"), Quotas::default(), GpuIsolation::default())
                .expect("create tenant")
                .0
                .id
        })
        .collect();
    (registry, ids)
}

fn tenant_registry(c: &mut Criterion) {
    let mut group = c.benchmark_group("tenant_registry");
    for n in [1usize, 16, 256] {
        let (registry, ids) = registry_with(n);
        let id = ids[n / 2].clone();
        group.bench_with_input(BenchmarkId::new("lookup", n), &id, |b, id| {
            b.iter(|| registry.lookup(black_box(id)))
        });
    }

    let (registry, ids) = registry_with(256);
    let tenant = registry.lookup(&ids[0]).expect("tenant");
    group.bench_function("consume_release/256KiB", |b| {
        b.iter(|| {
            let guard = tenant
                .acquire(Resource::GuestMemoryBytes, black_box(262_144))
                .expect("within quota");
            drop(black_box(guard));
        })
    });
    group.finish();
}

criterion_group!(benches, tenant_registry);
criterion_main!(benches);
