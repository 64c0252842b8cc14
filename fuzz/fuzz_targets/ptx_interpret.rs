//! Fuzzes the path a tenant kernel takes on a CPU host: the verifier and the fencing rewrite,
//! then the PTX interpreter over a small memory with a small step limit and a cancel word —
//! a refusal, an error or a finished launch, never a panic, never more host memory than the
//! interpreter's bounds allow.
#![no_main]

use std::sync::atomic::AtomicBool;

use libfuzzer_sys::fuzz_target;
use tensor_wasm_ptx_emu::{launch, Allocation, CancelWord, Launch, Module};

const BASE: u64 = 1 << 40;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let fenced = tensor_wasm_ptx_verify::fence(text).ok();
    for source in [Some(text), fenced.as_ref().map(|f| f.ptx.as_str())].into_iter().flatten() {
        let Ok(module) = Module::parse(source) else {
            continue;
        };
        for kernel in module.kernels() {
            // Every parameter points at the memory (or holds its address as a number).
            let values: Vec<Vec<u8>> = kernel
                .params()
                .iter()
                .map(|p| BASE.to_le_bytes()[..(p.size as usize).min(8)].to_vec())
                .collect();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let Ok(params) = kernel.pack_params(&refs) else {
                continue;
            };
            let flag = AtomicBool::new(false);
            let mut memory = vec![0u8; 4096];
            let mut config = Launch::new([2, 1, 1], [32, 1, 1], &params);
            config.dynamic_shared_bytes = 16;
            config.step_limit = 1 << 14;
            config.cancel = Some(CancelWord {
                address: BASE - 4096,
                flag: &flag,
            });
            let _ = launch(
                kernel,
                &config,
                &mut [Allocation {
                    base: BASE,
                    bytes: &mut memory,
                }],
            );
        }
    }
});
