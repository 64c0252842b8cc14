//! The host memory a launch may make the interpreter hold is bounded: a block whose threads
//! would need more than `BLOCK_MEMORY` of registers and local memory is refused before
//! anything runs.

use tensor_wasm_ptx_emu::{launch, EmuError, Launch, Module, BLOCK_MEMORY};

/// An entry with a 512 KiB local array (the most the parser takes) that writes one byte of it.
const BIG_LOCAL: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
    .visible .entry k()\n{\n.local .align 4 .b8 big[524288];\n.reg .b32 %r<2>;\n\
    mov.u32 %r1, 7;\nst.local.u32 [big], %r1;\nret;\n}\n";

#[test]
fn a_block_needing_more_host_memory_than_the_bound_is_refused() {
    let module = Module::parse(BIG_LOCAL).unwrap();
    let kernel = module.kernel("k").unwrap();
    // One thread: 512 KiB is within what one thread may hold.
    launch(kernel, &Launch::new([1, 1, 1], [1, 1, 1], &[]), &mut []).unwrap();
    // 1024 threads would hold 512 MiB.
    let error = launch(kernel, &Launch::new([1, 1, 1], [1024, 1, 1], &[]), &mut []).unwrap_err();
    match error {
        EmuError::InvalidLaunch { reason, .. } => {
            assert!(reason.contains(&BLOCK_MEMORY.to_string()), "{reason}")
        }
        other => panic!("expected a refused launch, got {other}"),
    }
}
