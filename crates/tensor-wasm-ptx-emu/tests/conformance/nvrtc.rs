//! The PTX NVRTC makes from the CUDA C++ test kernels of the conformance set
//! (`tensor_wasm_jit::conformance::CUDA_KERNELS`: the kernels of our tests and a few of the
//! shapes tenants write: a shared-memory reduction, dynamic shared memory, contracted
//! multiply-adds), run in the interpreter under every schedule against their Rust references,
//! the whole memory compared. Skipped, saying so, where NVRTC is not installed.

use std::collections::BTreeSet;

use tensor_wasm_gpu::{compile_cuda, nvrtc_available};
use tensor_wasm_jit::conformance::{cuda_cases, CUDA_KERNELS};
use tensor_wasm_ptx_emu::{Module, Schedule};

use crate::harness::{compare, run_emu};

/// Returns whether NVRTC was there to run the section.
pub fn run_all() -> bool {
    if let Err(reason) = nvrtc_available() {
        println!("NVRTC kernels skipped: {reason}");
        return false;
    }
    let mut used = BTreeSet::new();
    let modules: Vec<Module> = CUDA_KERNELS
        .iter()
        .map(|kernel| {
            let binary = compile_cuda(kernel.source, kernel.entry, (8, 0))
                .unwrap_or_else(|e| panic!("{}: {e}", kernel.entry));
            used.extend(crate::opcodes(&binary.ptx));
            Module::parse(&binary.ptx)
                .unwrap_or_else(|e| panic!("NVRTC PTX of {}: {e}\n{}", kernel.entry, binary.ptx))
        })
        .collect();
    println!(
        "instructions used by NVRTC's PTX of {} CUDA C++ kernels: {}",
        CUDA_KERNELS.len(),
        used.into_iter().collect::<Vec<_>>().join(" ")
    );
    for case in cuda_cases() {
        let index = CUDA_KERNELS
            .iter()
            .position(|k| k.entry == case.kernel.entry)
            .expect("a case of a listed kernel");
        for schedule in Schedule::ALL {
            let actual = run_emu(
                &modules[index],
                case.kernel.entry,
                &case.config,
                &case.args,
                &case.layout.memory,
                &case.layout.buffers,
                schedule,
            )
            .unwrap_or_else(|e| panic!("{} {schedule:?}: {e}", case.kernel.entry));
            if let Err(error) = compare(case.dtype, &case.expected, &actual) {
                panic!(
                    "{} ({}) {schedule:?}: {error}",
                    case.kernel.entry, case.kernel.about
                );
            }
        }
    }
    true
}
