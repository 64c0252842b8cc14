//! `cold-start`: an instance's way to its first kernel, with and without a snapshot.
//!
//! The guest has `size` bytes of "weights" that `init` computes (an LCG fill, standing in
//! for loading a model) and a `run` export whose first action is one kernel over all the
//! weights (builtin `scale` in place, alpha 1). Each row is whole `Runtime::invoke_export`
//! calls, one new instance each:
//! - **fresh + init**: a fresh instance runs `cold` = init, then the kernel;
//! - **restored**: an instance started from a snapshot taken after `init` runs `run`;
//! - **fresh, no init**: a fresh instance runs `run` on zeroed weights (instantiation plus the
//!   kernel: the floor without any state).

use std::time::Instant;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use tensor_wasm_runtime::DeploySpec;

use crate::common::{elapsed_ns, median, runtime, stats_ns, Section, Suite};

/// The guest for `bytes` bytes of weights at offset 65536.
pub fn guest(bytes: u64) -> String {
    let pages = 1 + bytes / 65_536;
    let n = bytes / 4;
    let grid = n.div_ceil(256);
    format!(
        r#"(module
  (import "wasi:cuda" "kernel_from_blueprint" (func $kernel (param i32 i32) (result i32)))
  (import "wasi:cuda" "launch"
    (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $ready (mut i32) (i32.const 0))
  (data (i32.const 128) "scale")
  (func $grow
    (if (i32.lt_u (memory.size) (i32.const {pages}))
      (then (drop (memory.grow (i32.sub (i32.const {pages}) (memory.size)))))))
  (func $record (param $at i32) (param $tag i32) (param $aux i32) (param $value i64)
    (i32.store (local.get $at) (local.get $tag))
    (i32.store offset=4 (local.get $at) (local.get $aux))
    (i64.store offset=8 (local.get $at) (local.get $value)))
  (func $init (export "init")
    (local $at i32) (local $x i32)
    (call $grow)
    (local.set $at (i32.const 65536))
    (local.set $x (i32.const 12345))
    (loop $fill
      (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 1664525)) (i32.const 1013904223)))
      (f32.store (local.get $at)
        (f32.mul (f32.convert_i32_s (i32.sub (i32.shr_u (local.get $x) (i32.const 20)) (i32.const 2048)))
                 (f32.const 0.00390625)))
      (local.set $at (i32.add (local.get $at) (i32.const 4)))
      (br_if $fill (i32.lt_u (local.get $at) (i32.const {end}))))
    (global.set $ready (i32.const 1)))
  (func $run (export "run") (result i32)
    (local $k i32) (local $rc i32)
    (call $grow)
    (local.set $k (call $kernel (i32.const 128) (i32.const 5)))
    (if (i32.lt_s (local.get $k) (i32.const 0)) (then (return (local.get $k))))
    (call $record (i32.const 0) (i32.const 7) (i32.const {bytes}) (i64.const 65536))
    (call $record (i32.const 16) (i32.const 7) (i32.const {bytes}) (i64.const 65536))
    (call $record (i32.const 32) (i32.const 5) (i32.const 0) (i64.const 1065353216))
    (call $record (i32.const 48) (i32.const 2) (i32.const 0) (i64.const {n}))
    (local.set $rc (call $launch (local.get $k) (i32.const {grid}) (i32.const 1) (i32.const 1)
      (i32.const 256) (i32.const 1) (i32.const 1) (i32.const 0) (i32.const 0) (i32.const 64)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (global.get $ready))
  (func (export "cold") (result i32)
    (call $init)
    (call $run)))
"#,
        end = 65_536 + bytes,
    )
}

pub fn run(suite: &Suite) -> anyhow::Result<Section> {
    let backend = suite.backend()?;
    let sizes: &[u64] = if suite.quick {
        &[1 << 20]
    } else {
        &[16 << 20, 256 << 20]
    };
    let calls = if suite.quick { 3 } else { 10 };
    let dir = suite.scratch()?;
    let max = sizes.iter().max().copied().unwrap_or(0) + (1 << 20);
    let rt = runtime(backend, dir.path(), max.max(16 << 20), 4, false)?;
    let mut section = Section::default();
    section.set("restore_mode", json!(rt.restore_mode().as_str()));
    let mut rows = Vec::new();
    for &size in sizes {
        let limit = (size + 65_536).div_ceil(1 << 20) << 20;
        let deploy = |name: &str| -> anyhow::Result<String> {
            let spec = DeploySpec {
                memory_limit_bytes: Some(limit),
                ..DeploySpec::export(name)
            };
            Ok(rt.deploy(guest(size).as_bytes(), spec)?.record.id)
        };
        let plain = deploy("cold-start-plain")?;
        let snap = deploy("cold-start-snapshot")?;
        let start = Instant::now();
        rt.create_snapshot(&snap, "init", true)
            .context("creating the snapshot")?;
        let capture_ns = elapsed_ns(start);
        let timed = |id: &str, export: &str, want: i64| -> anyhow::Result<Vec<f64>> {
            let mut samples = Vec::new();
            for i in 0..=calls {
                let start = Instant::now();
                let out = rt.invoke_export(id, export, &[])?;
                let ns = elapsed_ns(start);
                if out != vec![json!(want)] {
                    bail!("{export} returned {out:?}, expected [{want}]");
                }
                if i > 0 {
                    samples.push(ns);
                }
            }
            Ok(samples)
        };
        // Interleave the three so that drift hits them alike.
        let (mut fresh, mut restored, mut floor) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..2 {
            fresh.extend(timed(&plain, "cold", 1)?);
            restored.extend(timed(&snap, "run", 1)?);
            floor.extend(timed(&plain, "run", 0)?);
        }
        section.check(
            format!(
                "{} MiB: instances started from the snapshot see init's state",
                size >> 20
            ),
            true,
            "run returned 1 (the global init sets) from every restored instance",
        );
        rows.push(json!({
            "weights_bytes": size,
            "memory_limit_bytes": limit,
            "snapshot_capture_ns": capture_ns,
            "fresh_plus_init_to_first_kernel": stats_ns(&fresh),
            "restored_to_first_kernel": stats_ns(&restored),
            "fresh_no_init_to_first_kernel": stats_ns(&floor),
            "restored_over_fresh_plus_init_median": median(&restored) / median(&fresh),
            "restored_over_fresh_no_init_median": median(&restored) / median(&floor),
        }));
    }
    section.set("sizes", Value::Array(rows));
    section.set(
        "method",
        json!("whole Runtime::invoke_export calls (new instance, the export, its first kernel over all weights, return); interleaved rows, one untimed call each"),
    );
    Ok(section)
}
