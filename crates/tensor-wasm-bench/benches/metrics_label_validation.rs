//! `metrics_label_validation/try_new/{first,last,miss}`: the allow-list lookup that turns a
//! matched route template and method into metric label values
//! (`tensor_wasm_api::HttpRequestLabels::try_new`), for the first route of the list, the
//! last one, and a path that is not a route. Runs on every request.

use std::hint::black_box;

use axum::http::Method;
use criterion::{criterion_group, criterion_main, Criterion};
use tensor_wasm_api::{HttpRequestLabels, ROUTE_TEMPLATES};

fn try_new(c: &mut Criterion) {
    let mut group = c.benchmark_group("metrics_label_validation/try_new");
    let first = ROUTE_TEMPLATES[0];
    let last = ROUTE_TEMPLATES[ROUTE_TEMPLATES.len() - 1];
    for (name, route, hit) in [
        ("first", first, true),
        ("last", last, true),
        ("miss", "/functions/fn-0123/not-a-route", false),
    ] {
        assert_eq!(
            HttpRequestLabels::try_new(route, &Method::POST).is_some(),
            hit
        );
        group.bench_function(name, |b| {
            b.iter(|| HttpRequestLabels::try_new(black_box(route), black_box(&Method::POST)));
        });
    }
    group.finish();
}

criterion_group!(benches, try_new);
criterion_main!(benches);
