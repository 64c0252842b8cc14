//! `correctness`: every blueprint and builtin through the runtime API (the launcher guest →
//! `wasi:cuda` → dispatcher → backend), compared with the CPU backend run on a host copy of
//! the same memory; hostile out-of-bounds launches refused before anything is launched.

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use tensor_wasm_gpu::{open_backend, DeviceChoice};
use tensor_wasm_runtime::{DeploySpec, Runtime};

use crate::common::{runtime, Section, Suite};
use crate::plan::{self, Plan, LAUNCHER_WAT};

/// The `vector_add` example, whose `out_of_bounds` export is a hostile guest.
pub const VECTOR_ADD_WAT: &str = include_str!("../../../examples/vector_add.wat");

pub fn run(suite: &Suite, subset: bool) -> anyhow::Result<Section> {
    let backend = suite.backend()?;
    let cpu = open_backend(DeviceChoice::Cpu)?;
    let shapes = if subset || suite.quick { 1 } else { 2 };
    let mut plans = plan::catalogue(shapes)?;
    if subset {
        plans.retain(|p| !p.descriptor.ends_with(":i32"));
    }
    let limit = memory_limit(&plans);
    let dir = suite.scratch()?;
    let rt = runtime(backend.clone(), dir.path(), limit, 8, false)?;
    let id = deploy_launcher(&rt, limit)?;
    let mut section = Section::default();
    section.set("memory_limit_bytes", json!(limit));

    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for plan in &plans {
        let row = run_plan(&rt, &id, plan, &*cpu)?;
        if !row["equal"].as_bool().unwrap_or(false) {
            failed.push(plan.name.clone());
        }
        rows.push(row);
    }
    section.check(
        "every blueprint and builtin equals the CPU backend (runtime API)",
        failed.is_empty(),
        format!(
            "{} of {} plans equal{}",
            plans.len() - failed.len(),
            plans.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!("; differing: {}", failed.join(", "))
            }
        ),
    );
    section.set("plans", Value::Array(rows));
    hostile(&rt, &id, &mut section)?;
    Ok(section)
}

/// Memory limit for the launcher that fits every plan: whole MiB, at least 4 MiB.
pub fn memory_limit(plans: &[Plan]) -> u64 {
    let most = plans.iter().map(Plan::memory_bytes).max().unwrap_or(0);
    most.div_ceil(1 << 20).max(4) << 20
}

/// Deploys the launcher guest as a WASI command.
pub fn deploy_launcher(rt: &Runtime, limit: u64) -> anyhow::Result<String> {
    let spec = DeploySpec {
        memory_limit_bytes: Some(limit),
        ..DeploySpec::wasi("gpu-suite-launcher")
    };
    Ok(rt
        .deploy(LAUNCHER_WAT.as_bytes(), spec)
        .context("deploying the launcher guest")?
        .record
        .id)
}

/// Runs `plan` in the launcher and parses what it wrote.
pub fn invoke_plan(rt: &Runtime, id: &str, plan: &Plan) -> anyhow::Result<plan::GuestRun> {
    let output = rt
        .invoke_command(id, plan.encode()?)
        .with_context(|| format!("invoking the launcher for {}", plan.name))?;
    if output.exit_code != 0 {
        bail!(
            "launcher exited with {} for {}: {}",
            output.exit_code,
            plan.name,
            String::from_utf8_lossy(&output.stderr_tail)
        );
    }
    plan::parse_output(&output.stdout)
}

fn run_plan(
    rt: &Runtime,
    id: &str,
    plan: &Plan,
    cpu: &dyn tensor_wasm_gpu::Backend,
) -> anyhow::Result<Value> {
    let expected = plan.reference(cpu)?;
    let run = invoke_plan(rt, id, plan)?;
    let (mismatches, first) = if run.status == 0 {
        plan::compare(plan.out_type, &run.out, &expected)
    } else {
        (expected.len() / 4, None)
    };
    let equal = run.status == 0 && mismatches == 0;
    if !equal {
        println!(
            "  differs: {} status {} ({}) mismatches {mismatches} first {first:?}",
            plan.name, run.status, run.message
        );
    }
    Ok(json!({
        "plan": plan.name,
        "descriptor": plan.descriptor,
        "status": run.status,
        "message": run.message,
        "elements": expected.len() / 4,
        "mismatches": mismatches,
        "first_mismatch": first,
        "equal": equal,
        "digest": plan::digest(plan.out_type, &run.out),
        "expected_digest": plan::digest(plan.out_type, &expected),
    }))
}

/// Hostile launches: each must return INVALID_ARGUMENT (-1) and no kernel may be admitted.
fn hostile(rt: &Runtime, id: &str, section: &mut Section) -> anyhow::Result<()> {
    let launched = || rt.metrics().dispatch.latency.get_sample_count();
    let mut rows = Vec::new();
    for plan in plan::hostile_plans() {
        let before = launched();
        let run = invoke_plan(rt, id, &plan)?;
        let after = launched();
        let pass = run.status == -1 && after == before;
        section.check(
            plan.name.clone(),
            pass,
            format!(
                "status {} ({}), kernels completed during the call: {}",
                run.status,
                run.message,
                after - before
            ),
        );
        rows.push(json!({
            "plan": plan.name, "status": run.status, "message": run.message,
            "kernels_admitted": after - before,
        }));
    }
    // The example guest with a hostile export.
    let example = rt
        .deploy(
            VECTOR_ADD_WAT.as_bytes(),
            DeploySpec::export("vector_add-example"),
        )
        .context("deploying examples/vector_add.wat")?
        .record
        .id;
    let before = launched();
    let result = rt.invoke_export(&example, "out_of_bounds", &[])?;
    let after = launched();
    section.check(
        "hostile: examples/vector_add.wat out_of_bounds() is refused before launch",
        result == vec![json!(-1)] && after == before,
        format!(
            "results {result:?}, kernels completed during the call: {}",
            after - before
        ),
    );
    let good = rt.invoke_export(&example, "run", &[json!(1000)])?;
    section.check(
        "examples/vector_add.wat run(1000) counts 1000 correct sums",
        good == vec![json!(1000)],
        format!("results {good:?}"),
    );
    rows.push(json!({
        "plan": "examples/vector_add.wat out_of_bounds()",
        "results": result, "kernels_admitted": after - before,
    }));
    section.set("hostile", Value::Array(rows));
    Ok(())
}
