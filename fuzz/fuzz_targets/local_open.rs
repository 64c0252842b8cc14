//! Fuzzes `LocalImage::open` and the eager `read_into` with arbitrary file contents: errors
//! only, never a panic, never an allocation past the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_wasm_snapshot::{LocalImage, RestoreLimits};

fuzz_target!(|data: &[u8]| {
    let limits = RestoreLimits {
        max_memory_bytes: 16 << 20,
        max_meta_bytes: 64 << 10,
    };
    let mut module = [0u8; 32];
    let n = data.len().min(32);
    module[..n].copy_from_slice(&data[..n]);
    let path = std::env::temp_dir().join(format!("tw-fuzz-local-{}", std::process::id()));
    if std::fs::write(&path, &data[n..]).is_err() {
        return;
    }
    if let Ok(image) = LocalImage::open(&path, &limits, &module) {
        let mut out = vec![0u8; image.memory_size()];
        let _ = image.read_into(&mut out);
    }
    let _ = std::fs::remove_file(&path);
});
