//! Criterion benches of the kernel dispatcher's host path: permit acquire and
//! release plus completion-future poll, with no kernel behind it (the
//! completion is already resolved), so the figure is pure dispatch overhead.
//!
//! - `dispatch/serial/<N>`: N dispatches one after another on one thread.
//! - `dispatch/concurrent_cap64/<N>`: N dispatches as tasks on a 4-worker
//!   tokio runtime through a dispatcher capped at 64 in flight.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor_wasm_dispatch::{DispatchConfig, KernelDispatcher};

const COUNTS: [u64; 4] = [1, 10, 100, 1000];

fn serial(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch/serial");
    let dispatcher = KernelDispatcher::new(DispatchConfig::default());
    for n in COUNTS {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                for _ in 0..n {
                    let permit = dispatcher.acquire_blocking().expect("uncontended");
                    dispatcher.track(permit, std::future::ready(())).wait();
                }
            })
        });
    }
    group.finish();
}

fn concurrent(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch/concurrent_cap64");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .expect("tokio runtime");
    let dispatcher = KernelDispatcher::new(DispatchConfig {
        max_in_flight: 64,
        max_queued: 1 << 20,
    });
    for n in COUNTS {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                runtime.block_on(async {
                    let tasks: Vec<_> = (0..n)
                        .map(|_| {
                            let d = dispatcher.clone();
                            tokio::spawn(async move {
                                let permit = d.acquire().await.expect("queue is large enough");
                                d.track(permit, std::future::ready(())).await
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("task ran");
                    }
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, serial, concurrent);

criterion_main!(benches);
