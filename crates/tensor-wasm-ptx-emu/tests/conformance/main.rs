//! The conformance run of the PTX interpreter (its own `main`, so the summary is always
//! printed): the instructions our PTX uses, every builtin `.ptx` against the CPU backend,
//! every blueprint × dtype against `run_cpu` over random shapes and every schedule, and the
//! mutation check. Prints how many kernels and launches it exercised.

mod blueprints;
mod builtins;
mod harness;
mod mutations;
mod nvrtc;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tensor_wasm_gpu::BuiltinKernel;
use tensor_wasm_jit::PtxTarget;
use tensor_wasm_ptx_emu::Module;

use harness::{Modules, COUNTERS};

/// The opcodes (with modifiers) of every instruction line of `ptx`.
pub(crate) fn opcodes(ptx: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in ptx.lines() {
        let line = line.split("//").next().unwrap_or("").trim();
        let line = line.rsplit(':').next().unwrap_or("").trim();
        let line = match line.strip_prefix('@') {
            Some(guarded) => guarded.split_once(' ').map_or("", |(_, rest)| rest).trim(),
            None => line,
        };
        let Some(word) = line.split_whitespace().next() else {
            continue;
        };
        if word.starts_with('.')
            || word.starts_with('{')
            || word.starts_with('}')
            || !line.ends_with(';')
        {
            continue;
        }
        out.insert(word.trim_end_matches(';').to_owned());
    }
    out
}

fn main() {
    let started = Instant::now();
    let blueprints = tensor_wasm_jit::conformance::blueprints();
    let mut used = BTreeSet::new();
    for blueprint in &blueprints {
        for target in [
            PtxTarget::default(),
            PtxTarget::for_device((9, 0), 13000).unwrap(),
        ] {
            let ptx = blueprint.emit_ptx(&target);
            let module =
                Module::parse(&ptx).unwrap_or_else(|e| panic!("{blueprint} for {target}: {e}"));
            // The CUDA backend reads exactly this many parameter sizes from the driver
            // (`KernelProgram::param_count`).
            let entry = module.kernel(&blueprint.entry_name()).expect("the entry");
            assert_eq!(
                entry.params().len(),
                blueprint.params().len(),
                "{blueprint} for {target}: PTX parameters"
            );
            used.extend(opcodes(&ptx));
        }
    }
    for kernel in BuiltinKernel::ALL {
        Module::parse(kernel.ptx()).unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
        used.extend(opcodes(kernel.ptx()));
    }
    println!(
        "instructions used by {} blueprints and {} builtins: {}",
        blueprints.len(),
        BuiltinKernel::ALL.len(),
        used.iter().cloned().collect::<Vec<_>>().join(" ")
    );

    let modules = Modules::new();
    let (heavy, light): (Vec<_>, Vec<_>) = blueprints.into_iter().partition(blueprints::is_heavy);
    let mutants = std::thread::scope(|scope| {
        let light_run = scope.spawn(|| {
            builtins::run();
            nvrtc::run_all();
            blueprints::run(&light, &modules);
            mutations::run()
        });
        blueprints::run(&heavy, &modules);
        blueprints::run_random_kinds(24);
        light_run.join().expect("the light half passed")
    });
    let kernels = COUNTERS.kernels.lock().unwrap().len();
    let isa = tensor_wasm_gpu::gemm::Isa::selected();
    let seconds = started.elapsed().as_secs_f64();
    let kinds = tensor_wasm_jit::KIND_NAMES;
    println!(
        "ptx-emu conformance: {kernels} kernels ({} blueprint kinds: {}), {} launches, {} \
         threads, {} instructions interpreted; {}/{} mutants caught; CPU matmul and conv2d \
         tiles: {}; {seconds:.1} s",
        kinds.len(),
        kinds.join(", "),
        COUNTERS.launches.load(Ordering::Relaxed),
        COUNTERS.threads.load(Ordering::Relaxed),
        COUNTERS.instructions.load(Ordering::Relaxed),
        mutants.0,
        mutants.1,
        isa.name(),
    );
    // A run file when asked (`make conformance-isa`): which ISA the CPU backend's matmul and
    // conv2d tiles used on which CPU, and that every check passed (it is written last).
    if let Ok(path) = std::env::var("CONFORMANCE_RUN_FILE") {
        let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpu.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_once(':'))
                .map_or(String::new(), |(_, v)| v.trim().to_owned())
        };
        let flags = field("flags");
        let has: Vec<&str> = ["avx2", "avx512f", "avx512bw", "avx512vl"]
            .into_iter()
            .filter(|f| flags.split_whitespace().any(|x| x == *f))
            .collect();
        let run = format!(
            "{{\n  \"what\": \"ptx-emu conformance run (every check passed)\",\n  \
             \"gemm_isa\": \"{}\",\n  \"cpu\": \"{}\",\n  \"cpu_flags\": \"{}\",\n  \
             \"kernels\": {kernels},\n  \"launches\": {},\n  \"instructions\": {},\n  \
             \"mutants_caught\": {},\n  \"mutants\": {},\n  \"seconds\": {seconds:.1}\n}}\n",
            isa.name(),
            field("model name").replace('"', "'"),
            has.join(" "),
            COUNTERS.launches.load(Ordering::Relaxed),
            COUNTERS.instructions.load(Ordering::Relaxed),
            mutants.0,
            mutants.1,
        );
        std::fs::write(&path, run).expect("writing the conformance run file");
    }
}
