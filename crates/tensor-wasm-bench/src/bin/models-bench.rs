//! `models-bench`: the executor's side of `make models-bench` (scripts/models_bench.py).
//! Runs each named case of a `scripts/onnx/models.py` directory through the ONNX executor on
//! the CPU backend (every core), and prints one JSON line per case: the median seconds of one
//! run (inputs copied in, every kernel, outputs ready) over `--runs` timed runs after warm-up.
//!
//! With `--per-launch`, also each launch's median time (what the time goes to).
//!
//! Usage: models-bench DIR CASE... [--runs N] [--min-seconds S] [--per-launch]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tensor_wasm_onnx::proto::data_type;
use tensor_wasm_onnx::{BackendLauncher, Execution, Model, Options, TensorIn};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().context("usage: models-bench DIR CASE...")?);
    let (mut cases, mut runs, mut min_seconds) = (Vec::new(), 20usize, 1.0f64);
    let mut per_launch = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().context("--runs N")?.parse()?,
            "--min-seconds" => min_seconds = args.next().context("--min-seconds S")?.parse()?,
            "--per-launch" => per_launch = true,
            name => cases.push(name.to_owned()),
        }
    }
    if cases.is_empty() {
        bail!("name at least one case");
    }
    let mut launcher = BackendLauncher::cpu().map_err(|e| anyhow::anyhow!("{e}"))?;
    for name in cases {
        let at = dir.join(&name);
        let case: Value = serde_json::from_slice(&std::fs::read(at.join("case.json"))?)?;
        let model = Arc::new(
            Model::load(&std::fs::read(at.join("model.onnx"))?, &Options::default())
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?,
        );
        let mut exec: Execution<Vec<u8>> = Execution::new(model.clone());
        let mut batch = 0;
        for spec in case["inputs"].as_array().context("inputs")? {
            let index = model
                .inputs()
                .iter()
                .position(|i| i.name == spec["name"].as_str().unwrap_or(""))
                .context("an input of the model")?;
            let dims: Vec<usize> = spec["dims"]
                .as_array()
                .context("dims")?
                .iter()
                .map(|d| d.as_u64().unwrap_or(0) as usize)
                .collect();
            batch = dims.first().copied().unwrap_or(1);
            let data = std::fs::read(at.join(spec["file"].as_str().context("file")?))?;
            let data_type = if spec["dtype"] == "int64" {
                data_type::INT64
            } else {
                data_type::FLOAT
            };
            exec.set_input(
                index,
                TensorIn {
                    dims: &dims,
                    data_type,
                    data: &data,
                },
            )
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        }
        let mut run = |exec: &mut Execution<Vec<u8>>| -> anyhow::Result<f64> {
            let started = Instant::now();
            exec.compute(&mut launcher, &mut |n| Ok(vec![0u8; n]), None)
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            Ok(started.elapsed().as_secs_f64())
        };
        // Warm-up: the plan, the arena, the kernels' first loads.
        for _ in 0..3 {
            run(&mut exec)?;
        }
        let mut times = Vec::new();
        let started = Instant::now();
        while times.len() < runs || started.elapsed().as_secs_f64() < min_seconds {
            times.push(run(&mut exec)?);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        // With --per-launch: the median of runs made of the launches timed in sequence.
        let mut sequence_s = None;
        let launches = if per_launch {
            let plan = model
                .plan(&exec_shapes(&case), None)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut arena = vec![0u8; plan.arena_bytes];
            plan.write_constants(model.graph(), &mut arena);
            // One launch, timed (its outcome was checked by the runs above).
            let mut timed = |l: &tensor_wasm_onnx::plan::PlacedLaunch| {
                let started = Instant::now();
                let _ = tensor_wasm_onnx::Launcher::launch(
                    &mut launcher,
                    &l.blueprint,
                    &l.config,
                    &l.args,
                    &mut arena,
                );
                started.elapsed().as_secs_f64()
            };
            let mut alone = plan
                .launches
                .iter()
                .map(|l| {
                    let mut t: Vec<f64> = (0..runs.max(5)).map(|_| timed(l)).collect();
                    t.sort_by(f64::total_cmp);
                    json!({"kernel": l.blueprint.descriptor(), "median_s": t[t.len() / 2]})
                })
                .collect::<Vec<_>>();
            // The same launches timed in sequence, as a run makes them.
            let mut seq = vec![Vec::new(); plan.launches.len()];
            let mut sums = Vec::new();
            for _ in 0..runs.max(5) {
                let run_started = Instant::now();
                for (l, t) in plan.launches.iter().zip(&mut seq) {
                    t.push(timed(l));
                }
                sums.push(run_started.elapsed().as_secs_f64());
            }
            sums.sort_by(f64::total_cmp);
            sequence_s = Some(sums[sums.len() / 2]);
            for (entry, t) in alone.iter_mut().zip(&mut seq) {
                t.sort_by(f64::total_cmp);
                entry["in_sequence_s"] = json!(t[t.len() / 2]);
            }
            alone
        } else {
            Vec::new()
        };
        println!(
            "{}",
            json!({
                "case": name,
                "batch": batch,
                "runs": times.len(),
                "median_s": median,
                "items_per_s": batch as f64 / median,
                "launches": model.plan(&exec_shapes(&case), None).map(|p| p.launches.len()).unwrap_or(0),
                "per_launch": launches,
                "in_sequence_run_s": sequence_s,
            })
        );
    }
    Ok(())
}

/// The input shapes of `case`, in its order (the models here have one input).
fn exec_shapes(case: &Value) -> Vec<Vec<usize>> {
    case["inputs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|spec| {
            spec["dims"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| d.as_u64().unwrap_or(0) as usize)
                .collect()
        })
        .collect()
}
