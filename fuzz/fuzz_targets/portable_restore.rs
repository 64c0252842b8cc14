//! Fuzzes `restore_portable` with arbitrary bytes under small limits: it must return an error
//! or an image of exactly the declared size, and never panic or allocate past the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_wasm_snapshot::{restore_portable, RestoreLimits};

fuzz_target!(|data: &[u8]| {
    let limits = RestoreLimits {
        max_memory_bytes: 16 << 20,
        max_meta_bytes: 64 << 10,
    };
    // The module hash is part of the input so that the fuzzer can get past the hash check.
    let mut module = [0u8; 32];
    let n = data.len().min(32);
    module[..n].copy_from_slice(&data[..n]);
    let snapshot = &data[n..];
    if let Ok((meta, memory)) = restore_portable(snapshot, &limits, &module) {
        assert_eq!(memory.len() as u64, meta.memory_size_bytes);
    }
});
