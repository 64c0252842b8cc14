//! Checks that restoring hostile portable snapshots never makes a Rust heap allocation
//! larger than `RestoreLimits::max_memory_bytes`. This binary holds a single test because the
//! counting allocator below is process-global.
//!
//! The counting allocator is `tensor_wasm_mem::LargestRequestAllocator`, so this crate stays
//! free of `unsafe` code.

use proptest::prelude::*;
use tensor_wasm_mem::LargestRequestAllocator;
use tensor_wasm_snapshot::{
    capture_portable, realistic_image, restore_portable, CaptureOptions, RestoreLimits,
    SnapshotMeta,
};

#[global_allocator]
static ALLOCATOR: LargestRequestAllocator = LargestRequestAllocator::new();

const MODULE: [u8; 32] = [3; 32];

fn rewrite_header(snap: &mut [u8], at: usize, value: u64, width: usize) {
    snap[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    let crc = crc32c(&snap[..60]);
    snap[60..64].copy_from_slice(&crc.to_le_bytes());
}

fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn hostile_headers_never_allocate_beyond_the_limit(
        field in 0usize..7,
        value in any::<u64>(),
        flips in prop::collection::vec((any::<usize>(), 0u8..8), 0..3),
    ) {
        let memory = realistic_image(192 * 1024, 5);
        let meta = SnapshotMeta::new(MODULE, "f", "t", memory.len() as u64);
        let options = CaptureOptions { chunk_size: 65_536, ..CaptureOptions::default() };
        let mut snap = capture_portable(&meta, &memory, &options).unwrap();
        for (at, bit) in flips {
            let at = at % snap.len();
            snap[at] ^= 1 << bit;
        }
        let (at, width) = [(12, 4), (16, 4), (20, 4), (24, 8), (32, 8), (40, 8), (48, 4)][field];
        rewrite_header(&mut snap, at, value, width);
        // Snapshot bytes are already allocated; the bound concerns what restore adds.
        let limit = 256 * 1024;
        let limits = RestoreLimits { max_memory_bytes: limit, max_meta_bytes: 4096 };
        ALLOCATOR.reset();
        let result = restore_portable(&snap, &limits, &MODULE);
        let largest = ALLOCATOR.largest();
        prop_assert!(largest as u64 <= limit, "allocated {largest} bytes at once");
        if let Ok((_, back)) = result {
            prop_assert!(back == memory);
            // The counter sees the image allocation, so the bound above is not vacuous.
            prop_assert!(largest >= memory.len());
        }
    }
}
