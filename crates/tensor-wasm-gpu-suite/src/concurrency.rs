//! `concurrency`: dispatch under load. 1, 8 and 64 guests at once (one thread each, as the
//! server runs invocations), each invocation a launcher guest making a run of small kernel
//! launches (builtin `vector_add`, 4096 elements) through `wasi:cuda.launch`, timed in the
//! guest. Reported per level: kernel launches per second over the level's wall time (new
//! instances included), the guests' per-launch latency, and invocations' latency.

use std::time::Instant;

use anyhow::bail;
use serde_json::{json, Value};
use tensor_wasm_gpu::BuiltinKernel;

use crate::common::{elapsed_ns, runtime, stats_ns, Section, Suite};
use crate::correctness::{deploy_launcher, invoke_plan};
use crate::plan::builtin_plan;

pub const LEVELS: [usize; 3] = [1, 8, 64];

pub fn run(suite: &Suite) -> anyhow::Result<Section> {
    let backend = suite.backend()?;
    let (warmup, repeats) = if suite.quick { (2, 20) } else { (5, 200) };
    let plan =
        builtin_plan(BuiltinKernel::VectorAdd, [4096, 0, 0], 9).with_launches(warmup, repeats);
    let dir = suite.scratch()?;
    let rt = runtime(backend, dir.path(), 4 << 20, 80, false)?;
    let id = deploy_launcher(&rt, 4 << 20)?;
    let max_in_flight = rt.dispatcher().config().max_in_flight;
    // One untimed invocation: module compiled, kernel loaded.
    invoke_plan(&rt, &id, &plan)?;
    let mut section = Section::default();
    let mut rows = Vec::new();
    for guests in LEVELS {
        let per_guest = if suite.quick {
            1
        } else {
            (128 / guests).max(2)
        };
        let rejected_before = rt.metrics().dispatch.rejected.get();
        let start = Instant::now();
        let results: Vec<anyhow::Result<(Vec<f64>, Vec<f64>)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..guests)
                .map(|_| {
                    scope.spawn(|| -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
                        let (mut launches, mut calls) = (Vec::new(), Vec::new());
                        for _ in 0..per_guest {
                            let call = Instant::now();
                            let run = invoke_plan(&rt, &id, &plan)?;
                            calls.push(elapsed_ns(call));
                            if run.status != 0 {
                                bail!("guest launch failed: {} {}", run.status, run.message);
                            }
                            launches.extend(run.timings_ns.iter().map(|&t| t as f64));
                        }
                        Ok((launches, calls))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("guest thread panicked")))
                })
                .collect()
        });
        let wall_ns = elapsed_ns(start);
        let (mut launches, mut calls) = (Vec::new(), Vec::new());
        for result in results {
            let (l, c) = result?;
            launches.extend(l);
            calls.extend(c);
        }
        let total = (guests * per_guest) as f64 * f64::from(warmup + repeats);
        let rejected = rt.metrics().dispatch.rejected.get() - rejected_before;
        section.check(
            format!("{guests} concurrent guests: every launch admitted and completed"),
            rejected == 0 && launches.len() == guests * per_guest * repeats as usize,
            format!("{} timed launches, {rejected} rejected", launches.len()),
        );
        println!(
            "  {guests} guests: {:.0} launches/s",
            total / (wall_ns * 1e-9)
        );
        rows.push(json!({
            "guests": guests,
            "invocations_per_guest": per_guest,
            "launches_per_invocation": warmup + repeats,
            "wall_ns": wall_ns,
            "launches_per_s": total / (wall_ns * 1e-9),
            "invocations_per_s": (guests * per_guest) as f64 / (wall_ns * 1e-9),
            "launch_latency": stats_ns(&launches),
            "invocation_latency": stats_ns(&calls),
        }));
    }
    section.set("levels", Value::Array(rows));
    section.set(
        "method",
        json!({
            "kernel": "builtin vector_add, 4096 elements, 16 blocks of 256",
            "dispatcher_max_in_flight": max_in_flight,
            "launch_latency": "guest-timed wasi:cuda.launch (WASI monotonic clock), untimed warm-up launches excluded",
            "launches_per_s": "all launches (warm-up included) / wall time of the level, instance creation included",
        }),
    );
    Ok(section)
}
