//! How fast the PTX interpreter runs tenant kernels, which is what a CPU host runs them in:
//! every CUDA C++ kernel of the conformance set (compiled by NVRTC for sm_80), its own module
//! and the fenced one, launched on its conformance case in the interpreter, interleaved
//! (plain, fenced, plain, fenced, ...) for `--rounds` rounds. Prints a table and, with
//! `--out FILE`, writes a run file (`make interp-speed`). Needs NVRTC; build it with
//! `--release`, as the server is.

use std::time::Instant;

use tensor_wasm_gpu::{compile_cuda, nvrtc_available};
use tensor_wasm_jit::conformance::{cuda_cases, first_difference, CudaCase};
use tensor_wasm_ptx_emu::{launch, Allocation, Launch, Module};

/// Device address of guest-memory byte 0; the cancel word lies below it.
const BASE: u64 = 1 << 40;

/// One launch of `case` with `module` (fenced: with the hidden parameters): seconds,
/// instructions, the memory it left.
fn run(module: &Module, case: &CudaCase, fenced: bool) -> (f64, u64, Vec<u8>) {
    let kernel = module.kernel(case.kernel.entry).expect("the case's entry");
    let mut values: Vec<Vec<u8>> = case.args.iter().map(|arg| arg.param_bytes(BASE)).collect();
    let mut memory = case.layout.memory.clone();
    let mut dynamic = case.config.shared_bytes;
    let cancel_at = BASE - 4096;
    if fenced {
        dynamic = tensor_wasm_ptx_verify::dynamic_shared_bytes(dynamic);
        let hi = BASE + (memory.len() as u64 & !15);
        let hidden = tensor_wasm_ptx_verify::hidden_args(BASE, hi, dynamic, cancel_at);
        values.extend(hidden.iter().map(|v| v.to_le_bytes().to_vec()));
    }
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let params = kernel.pack_params(&refs).expect("the case's arguments fit");
    let mut config = Launch::new(case.config.grid, case.config.block, &params);
    config.dynamic_shared_bytes = dynamic;
    let mut cancel = [0u8; 4];
    let started = Instant::now();
    let stats = launch(
        kernel,
        &config,
        &mut [
            Allocation {
                base: BASE,
                bytes: &mut memory,
            },
            Allocation {
                base: cancel_at,
                bytes: &mut cancel,
            },
        ],
    )
    .unwrap_or_else(|e| panic!("{}: {e}", case.kernel.entry));
    (started.elapsed().as_secs_f64(), stats.instructions, memory)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut rounds, mut out) = (5usize, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("a count"),
            "--out" => out = args.next(),
            other => panic!("unknown argument {other}"),
        }
    }
    if let Err(reason) = nvrtc_available() {
        eprintln!("needs NVRTC: {reason}");
        std::process::exit(2);
    }
    let mut rows = Vec::new();
    println!("kernel | instructions | fenced instructions | median s | fenced median s | Minstr/s fenced");
    for case in cuda_cases() {
        let entry = case.kernel.entry;
        let binary = compile_cuda(case.kernel.source, entry, (8, 0)).expect("NVRTC compiles it");
        let fenced = tensor_wasm_ptx_verify::fence(&binary.ptx).expect("the verifier accepts it");
        let plain = Module::parse(&binary.ptx).expect("it parses");
        let guarded = Module::parse(&fenced.ptx).expect("the fenced module parses");
        let (mut plain_s, mut fenced_s) = (Vec::new(), Vec::new());
        let (mut plain_n, mut fenced_n) = (0, 0);
        for _ in 0..rounds {
            let (s, n, memory) = run(&plain, &case, false);
            assert!(first_difference(case.dtype, &case.expected, &memory).is_none());
            plain_s.push(s);
            plain_n = n;
            let (s, n, memory) = run(&guarded, &case, true);
            assert!(first_difference(case.dtype, &case.expected, &memory).is_none());
            fenced_s.push(s);
            fenced_n = n;
        }
        let rate = |n: u64, s: &[f64]| n as f64 / median(&mut s.to_vec()) / 1e6;
        println!(
            "{entry} | {plain_n} | {fenced_n} | {:.6} | {:.6} | {:.1}",
            median(&mut plain_s.clone()),
            median(&mut fenced_s.clone()),
            rate(fenced_n, &fenced_s)
        );
        let span = |s: &[f64]| {
            let min = s.iter().copied().fold(f64::INFINITY, f64::min);
            let max = s.iter().copied().fold(0.0, f64::max);
            serde_json::json!({"median": median(&mut s.to_vec()), "min": min, "max": max})
        };
        rows.push(serde_json::json!({
            "kernel": entry,
            "unfenced_instructions": plain_n,
            "fenced_instructions": fenced_n,
            "unfenced_seconds": span(&plain_s),
            "fenced_seconds": span(&fenced_s),
            "unfenced_minstr_per_s": rate(plain_n, &plain_s),
            "fenced_minstr_per_s": rate(fenced_n, &fenced_s),
        }));
    }
    if let Some(path) = out {
        let doc = serde_json::json!({
            "kind": "interp-speed",
            "command": format!(
                "make interp-speed (cargo run --release -p tensor-wasm-ptx-verify --example \
                 interp_speed -- --rounds {rounds})"
            ),
            "commit": tensor_wasm_gates::runinfo::commit(),
            "date": tensor_wasm_gates::runinfo::utc_now(),
            "machine": tensor_wasm_gates::runinfo::machine(),
            "rounds": rounds,
            "method": "each CUDA C++ kernel of the conformance set on its conformance case, one \
                thread of the PTX interpreter (release build), the tenant's module and the fenced \
                one interleaved per round; wall clock of the launch alone (parsing and the copy \
                of the case's memory excluded), median and range over the rounds; every launch's \
                memory checked against the reference",
            "kernels": rows,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
        println!("wrote {path}");
    }
}
