//! What the `ptx_interpret` fuzz target checks, on every `cargo test`: random edits of tenant
//! kernels (characters and lines deleted, inserted, duplicated, swapped) go through the
//! verifier, the rewrite and the interpreter without a panic — a refusal, an error or a
//! finished launch.

use std::sync::atomic::AtomicBool;

use proptest::prelude::*;
use tensor_wasm_ptx_emu::{launch, Allocation, CancelWord, EmuError, Launch, Module};

const BASE: u64 = 1 << 40;

/// Small kernels with loops, calls, shared and local memory, atomics and a shuffle.
const SEEDS: [&str; 3] = [
    ".version 8.0\n.target sm_80\n.address_size 64\n\
     .visible .entry spin(.param .u64 p, .param .u32 n)\n{\n\
     .reg .pred %p<3>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<6>;\n\
     ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n]; mov.u32 %r2, %tid.x;\n\
     LOOP: ld.global.u32 %r3, [%rd1]; add.u32 %r3, %r3, %r2; st.global.u32 [%rd1+4], %r3;\n\
     add.u32 %r2, %r2, 32; setp.lt.u32 %p1, %r2, %r1; @%p1 bra LOOP;\n\
     atom.global.add.u32 %r4, [%rd1+8], 1;\n\
     shfl.sync.down.b32 %r5, %r4, 1, 31, -1;\nret;\n}\n",
    ".version 8.0\n.target sm_80\n.address_size 64\n\
     .func (.param .b32 r) twice(.param .b32 x)\n{\n.reg .b32 %r<3>;\n\
     ld.param.b32 %r1, [x]; shl.b32 %r2, %r1, 1; st.param.b32 [r], %r2;\nret;\n}\n\
     .visible .entry calls(.param .u64 p)\n{\n\
     .local .align 4 .b8 scratch[64];\n.shared .align 4 .b8 tile[256];\n\
     .reg .b32 %r<6>;\n.reg .b64 %rd<6>;\n\
     ld.param.u64 %rd1, [p]; mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 2;\n\
     cvt.u64.u32 %rd2, %r2; mov.u64 %rd3, tile; add.u64 %rd3, %rd3, %rd2;\n\
     st.shared.u32 [%rd3], %r1; bar.sync 0;\n\
     { .param .b32 a; .param .b32 b; st.param.b32 [a], %r1;\n\
     call.uni (b), twice, (a); ld.param.b32 %r3, [b]; }\n\
     st.local.u32 [scratch], %r3; ld.local.u32 %r4, [scratch];\n\
     add.u64 %rd4, %rd1, %rd2; st.global.u32 [%rd4], %r4;\nret;\n}\n",
    ".version 8.0\n.target sm_80\n.address_size 64\n\
     .visible .entry wild(.param .u64 p, .param .u64 offset, .param .u32 value)\n{\n\
     .reg .b32 %r<2>;\n.reg .b64 %rd<4>;\n\
     ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [offset]; ld.param.u32 %r1, [value];\n\
     add.u64 %rd3, %rd1, %rd2; st.global.u32 [%rd3], %r1;\n\
     cvta.to.global.u64 %rd3, %rd3; ld.global.nc.u32 %r1, [%rd3+-4];\nret;\n}\n",
];

/// The characters an edit inserts: enough to make other registers, spaces, numbers and
/// instructions.
const ALPHABET: &[u8] = b"%rdp0123456789[]+-;,. \n{}@!abcgilmnostuvx";

#[derive(Debug, Clone)]
enum Edit {
    DeleteChar(usize),
    InsertChar(usize, usize),
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        any::<usize>().prop_map(Edit::DeleteChar),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::InsertChar(a, b)),
        any::<usize>().prop_map(Edit::DeleteLine),
        any::<usize>().prop_map(Edit::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for edit in edits {
        let mut lines: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
        let n = lines.len();
        match *edit {
            Edit::DeleteChar(at) if !bytes.is_empty() => {
                bytes.remove(at % bytes.len());
                continue;
            }
            Edit::InsertChar(at, c) => {
                bytes.insert(at % (bytes.len() + 1), ALPHABET[c % ALPHABET.len()]);
                continue;
            }
            Edit::DeleteLine(at) => {
                lines.remove(at % n);
            }
            Edit::DuplicateLine(at) => {
                let line = lines[at % n].clone();
                lines.insert(at % n, line);
            }
            Edit::SwapLines(a, b) => lines.swap(a % n, b % n),
            Edit::DeleteChar(_) => continue,
        }
        bytes = lines.join(&b'\n');
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Each entry's launch-time proof for a launch over the 4 KiB window, and when it admits the
/// lean entry, that entry run over the window alone: it must never leave it (the cancel
/// word lies outside it, and a proven launch needs no poll).
fn run_admitted(fenced: &tensor_wasm_ptx_verify::Fenced) {
    let Ok(module) = Module::parse(&fenced.ptx) else {
        return;
    };
    for entry in &fenced.kernels {
        let Some(plan) = tensor_wasm_ptx_verify::Plan::new(&fenced.ptx, entry) else {
            continue;
        };
        let Some(kernel) = module.kernel(plan.lean_entry()) else {
            continue;
        };
        let mut values: Vec<Vec<u8>> = kernel
            .params()
            .iter()
            .map(|p| BASE.to_le_bytes()[..(p.size as usize).min(8)].to_vec())
            .collect();
        let tenant = values.len().saturating_sub(4);
        let facts = tensor_wasm_ptx_verify::LaunchFacts {
            params: &values[..tenant],
            grid: [2, 1, 1],
            block: [32, 1, 1],
            dynamic_shared: 16,
            window: (BASE, BASE + 4096),
        };
        if plan.admit(&facts).is_err() {
            continue;
        }
        let hidden = tensor_wasm_ptx_verify::hidden_args(BASE, BASE + 4096, 16, BASE - 4096);
        for (value, hidden) in values[tenant..].iter_mut().zip(hidden) {
            *value = hidden.to_le_bytes().to_vec();
        }
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let Ok(params) = kernel.pack_params(&refs) else {
            continue;
        };
        let mut memory = vec![0u8; 4096];
        let mut config = Launch::new([2, 1, 1], [32, 1, 1], &params);
        config.dynamic_shared_bytes = 16;
        config.step_limit = 1 << 20;
        let outcome = launch(
            kernel,
            &config,
            &mut [Allocation {
                base: BASE,
                bytes: &mut memory,
            }],
        );
        if let Err(error) = outcome {
            assert!(
                !matches!(
                    error,
                    EmuError::IllegalAddress { .. } | EmuError::Misaligned { .. }
                ),
                "a proven launch escaped: {error}\n{}",
                fenced.ptx
            );
        }
    }
}

/// Every entry of `text` launched over 4 KiB with a small step limit; the outcome is ignored.
fn run_all(text: &str) {
    let Ok(module) = Module::parse(text) else {
        return;
    };
    for kernel in module.kernels() {
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
        config.step_limit = 1 << 12;
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

#[test]
fn the_seeds_parse_and_fence() {
    for seed in SEEDS {
        Module::parse(seed).unwrap_or_else(|e| panic!("{e}\n{seed}"));
        tensor_wasm_ptx_verify::fence(seed).unwrap_or_else(|e| panic!("{e}\n{seed}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn edited_kernels_never_panic(seed in 0..SEEDS.len(), edits in prop::collection::vec(edit(), 1..6)) {
        let text = apply(SEEDS[seed], &edits);
        run_all(&text);
        if let Ok(fenced) = tensor_wasm_ptx_verify::fence(&text) {
            run_all(&fenced.ptx);
            run_admitted(&fenced);
        }
    }
}
