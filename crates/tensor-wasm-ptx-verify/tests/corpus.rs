//! Fencing changes nothing a correct kernel computes: every CUDA C++ kernel of the
//! conformance set (the corpus included), compiled by NVRTC, verifies, and its fenced
//! module leaves exactly the memory its Rust reference predicts — the same bytes as the
//! tenant's own module — under every schedule of the interpreter; and NVIDIA's `ptxas`
//! assembles the fenced module. Skipped, saying so, where NVRTC is not installed.

mod common;

use tensor_wasm_gpu::{compile_cuda, nvrtc_available};
use tensor_wasm_jit::conformance::{cuda_cases, first_difference};
use tensor_wasm_ptx_emu::{Module, Schedule};

use common::{run, Mode};
use tensor_wasm_ptx_verify::{LaunchFacts, Plan, Proof, Unproven};

/// The proof's verdict for `facts` and its median time in microseconds over 21 fresh plans
/// (each verdict is otherwise cached per launch).
fn proof_time(plan: &Plan, facts: &LaunchFacts<'_>) -> (Result<Proof, Unproven>, f64) {
    let mut times = Vec::new();
    let mut verdict = plan.admit(facts);
    for _ in 0..21 {
        let started = std::time::Instant::now();
        verdict = plan.prove_uncached(facts);
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    (verdict, times[times.len() / 2])
}

/// `$TENSOR_WASM_PTXAS`, or the copy `scripts/install-deps.sh` puts under `.tools/`.
fn ptxas() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("TENSOR_WASM_PTXAS") {
        return path.into();
    }
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/cuda/bin/ptxas")
}

/// Assembles `ptx` for sm_80 with warnings as errors.
fn assemble(name: &str, ptx: &str, dir: &std::path::Path) {
    let source = dir.join(format!("{name}.ptx"));
    std::fs::write(&source, ptx).unwrap();
    let output = std::process::Command::new(ptxas())
        .args(["--warning-as-error", "--gpu-name=sm_80", "--output-file"])
        .arg(dir.join(format!("{name}.cubin")))
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas().display()));
    assert!(
        output.status.success(),
        "ptxas rejected the fenced {name}:\n{}\n--- PTX ---\n{ptx}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn every_cuda_kernel_of_the_conformance_set_gives_the_same_bytes_fenced() {
    if let Err(reason) = nvrtc_available() {
        println!("skipped: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut summary = Vec::new();
    let mut counts = Vec::new();
    for case in cuda_cases() {
        let entry = case.kernel.entry;
        let binary = compile_cuda(case.kernel.source, entry, (8, 0)).unwrap();
        let fenced = tensor_wasm_ptx_verify::fence(&binary.ptx)
            .unwrap_or_else(|refusal| panic!("{entry} refused: {refusal}\n{}", binary.ptx));
        assemble(entry, &fenced.ptx, dir.path());
        let plain = Module::parse(&binary.ptx).unwrap();
        let guarded = Module::parse(&fenced.ptx)
            .unwrap_or_else(|e| panic!("{entry}: fenced PTX does not parse: {e}\n{}", fenced.ptx));
        let lean_plan = Plan::new(&fenced.ptx, entry).expect("every entry has a lean copy");
        let plan = Some(&lean_plan);
        for schedule in Schedule::ALL {
            let unfenced = run(&plain, None, &case, Mode::Plain, schedule)
                .unwrap_or_else(|e| panic!("{entry} {schedule:?}: {e}"));
            let with_fences = run(&guarded, plan, &case, Mode::Fenced, schedule)
                .unwrap_or_else(|e| panic!("{entry} fenced {schedule:?}: {e}\n{}", fenced.ptx));
            assert_eq!(
                with_fences.memory, unfenced.memory,
                "{entry} {schedule:?}: fenced and unfenced memories differ"
            );
            let checked = run(&guarded, plan, &case, Mode::Checked, schedule)
                .unwrap_or_else(|e| panic!("{entry} checked {schedule:?}: {e}"));
            assert_eq!(
                checked.memory, unfenced.memory,
                "{entry} {schedule:?}: the checked launch's memory differs"
            );
            if let Some(difference) = first_difference(case.dtype, &case.expected, &unfenced.memory)
            {
                panic!("{entry} {schedule:?}: {difference}");
            }
        }
        let plain_count = run(&plain, None, &case, Mode::Plain, Schedule::InOrder)
            .unwrap()
            .instructions;
        let fenced_count = run(&guarded, plan, &case, Mode::Fenced, Schedule::InOrder)
            .unwrap()
            .instructions;
        let checked = run(&guarded, plan, &case, Mode::Checked, Schedule::InOrder).unwrap();
        let facts = LaunchFacts {
            params: &common::pack(&case.args),
            grid: case.config.grid,
            block: case.config.block,
            dynamic_shared: tensor_wasm_ptx_verify::dynamic_shared_bytes(case.config.shared_bytes),
            window: (common::BASE, common::BASE + case.layout.memory.len() as u64),
        };
        let (proof, proof_micros) = proof_time(&lean_plan, &facts);
        let verdict = match &proof {
            Ok(p) => format!(
                "proven in {} steps, {} rounds, at most {} instructions a thread",
                p.steps, p.rounds, p.longest
            ),
            Err(why) => format!("not proven: {why}"),
        };
        let overhead = |n: u64| n as f64 / plain_count as f64 - 1.0;
        counts.push(serde_json::json!({
            "kernel": entry, "unfenced_instructions": plain_count,
            "fenced_instructions": fenced_count,
            "fenced_overhead": overhead(fenced_count),
            "checked_instructions": checked.instructions,
            "lean": checked.lean,
            "proof": verdict,
            "proof_microseconds_median": proof_micros,
            "overhead": overhead(checked.instructions),
            "fences": fenced.fences, "grouped": fenced.grouped, "polls": fenced.polls,
            "proven": fenced.proven,
        }));
        summary.push(format!(
            "{entry}: {} fences, {} grouped, {} polls, {} proven; {plain_count} -> {fenced_count} instructions fenced ({:+.1} %); checked: {} ({:+.1} %), {verdict}, {proof_micros:.0} µs",
            fenced.fences,
            fenced.grouped,
            fenced.polls,
            fenced.proven,
            100.0 * overhead(fenced_count),
            checked.instructions,
            100.0 * overhead(checked.instructions),
        ));
    }
    println!("{}", summary.join("\n"));
    // `make fence-overhead` keeps these counts as a run file.
    if let Some(path) = std::env::var_os("TENSOR_WASM_FENCE_OVERHEAD_OUT") {
        let geomean = |field: &str| {
            (counts
                .iter()
                .map(|c| (1.0 + c[field].as_f64().unwrap()).ln())
                .sum::<f64>()
                / counts.len() as f64)
                .exp()
                - 1.0
        };
        let doc = serde_json::json!({
            "kind": "fence-overhead",
            "command": "make fence-overhead (cargo test -p tensor-wasm-ptx-verify --test corpus)",
            "commit": tensor_wasm_gates::runinfo::commit(),
            "date": tensor_wasm_gates::runinfo::utc_now(),
            "machine": tensor_wasm_gates::runinfo::machine(),
            "method": "dynamic instructions the PTX interpreter executes for each CUDA C++ kernel \
                of the conformance set on its conformance case (in order): the tenant's module, the \
                fenced entry, and the entry a backend runs (`checked`: the lean entry when the \
                launch-time proof admits the launch, else the fenced one); exact and repeatable. \
                `overhead` is the checked entry's; the proof's own cost is host time per launch \
                (median of 21 proofs, debug build), not an instruction of the kernel",
            "target": {"geomean_overhead_at_most": 0.03},
            "kernels": counts,
            "geomean_overhead": geomean("overhead"),
            "geomean_fenced_overhead": geomean("fenced_overhead"),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
        println!("wrote {}", std::path::Path::new(&path).display());
    }
    assert!(summary.len() >= 13, "the whole corpus ran");
}
