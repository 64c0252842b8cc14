//! Round trips of realistic images through both encodings, refusal of foreign snapshots,
//! lazy copy-on-write mapping, and property tests over corrupted snapshot bytes.

use proptest::prelude::*;
use tensor_wasm_snapshot::{
    capture_portable, portable_to_local, read_portable_meta, realistic_image, restore_portable,
    write_local, AnonymousPages, CaptureOptions, GlobalValue, LocalImage, RestoreLimits,
    SnapshotError, SnapshotMeta, ValType, PORTABLE_HEADER_LEN,
};

const MODULE: [u8; 32] = [0x5a; 32];

/// [`LocalImage::map_into`] on the images these tests write.
#[allow(unsafe_code)]
fn map_into(image: &LocalImage, dest: &mut [u8]) -> Result<(), SnapshotError> {
    // SAFETY: every image here lives in a private temporary directory and is written once by
    // `write_local` or `portable_to_local` (temporary name, then rename) before it is opened;
    // nothing truncates or rewrites it while a mapping of it lives.
    unsafe { image.map_into(dest) }
}

fn meta_for(memory: &[u8]) -> SnapshotMeta {
    let mut meta = SnapshotMeta::new(MODULE, "thumbnail", "acme", memory.len() as u64);
    meta.created_at_ms = 1_700_000_000_000;
    meta.globals = vec![
        GlobalValue {
            index: 0,
            ty: ValType::I32,
            bits: 65_536,
        },
        GlobalValue {
            index: 1,
            ty: ValType::F32,
            bits: u128::from(f32::NAN.to_bits() | 0x1234),
        },
        GlobalValue {
            index: 2,
            ty: ValType::V128,
            bits: u128::MAX - 7,
        },
    ];
    meta
}

#[test]
fn portable_round_trip_preserves_image_and_metadata() {
    for (len, seed) in [(0, 1), (65_536, 2), (5 << 20, 3), ((3 << 20) + 65_536, 4)] {
        let memory = realistic_image(len, seed);
        let meta = meta_for(&memory);
        let snap = capture_portable(&meta, &memory, &CaptureOptions::default()).unwrap();
        let (meta_back, back) =
            restore_portable(&snap, &RestoreLimits::default(), &MODULE).unwrap();
        assert_eq!(meta_back, meta);
        assert!(back == memory, "image of {len} bytes differs");
        assert_eq!(
            read_portable_meta(&snap, &RestoreLimits::default(), &MODULE).unwrap(),
            meta
        );
        if len >= 1 << 20 {
            // Realistic data compresses, but not to nothing.
            assert!(
                snap.len() < len && snap.len() > len / 10,
                "{} of {len}",
                snap.len()
            );
        }
    }
}

#[test]
fn local_round_trip_eager_and_lazy() {
    let dir = tempfile::tempdir().unwrap();
    let memory = realistic_image(6 << 20, 11);
    let meta = meta_for(&memory);
    let path = dir.path().join("image.twl");
    write_local(&meta, &memory, &path).unwrap();

    let image = LocalImage::open(&path, &RestoreLimits::default(), &MODULE).unwrap();
    assert_eq!(image.meta(), &meta);
    assert!(
        image.stored_bytes() < memory.len() as u64,
        "zero pages are not stored"
    );
    image.verify().unwrap();

    let mut eager = vec![0xffu8; memory.len()];
    image.read_into(&mut eager).unwrap();
    assert!(eager == memory);

    // Destination larger than the image, not zeroed: the tail is left alone.
    let mut lazy = AnonymousPages::new(memory.len() + 8192).unwrap();
    lazy.as_mut_slice().fill(0xee);
    map_into(&image, lazy.as_mut_slice()).unwrap();
    assert!(lazy.as_slice()[..memory.len()] == memory[..]);
    assert!(lazy.as_slice()[memory.len()..].iter().all(|&b| b == 0xee));

    // Copy-on-write: writes land in the mapping, never in the file.
    let before = std::fs::read(&path).unwrap();
    lazy.as_mut_slice()[..memory.len()].fill(0x42);
    assert!(lazy.as_slice()[..memory.len()].iter().all(|&b| b == 0x42));
    drop(lazy);
    assert!(std::fs::read(&path).unwrap() == before);
    let again = LocalImage::open(&path, &RestoreLimits::default(), &MODULE).unwrap();
    let mut fresh = AnonymousPages::new(memory.len()).unwrap();
    map_into(&again, fresh.as_mut_slice()).unwrap();
    assert!(fresh.as_slice() == &memory[..]);
}

#[test]
fn portable_converts_to_local() {
    let dir = tempfile::tempdir().unwrap();
    let memory = realistic_image(2 << 20, 5);
    let meta = meta_for(&memory);
    let snap = capture_portable(&meta, &memory, &CaptureOptions::default()).unwrap();
    let path = dir.path().join("converted.twl");
    let got = portable_to_local(&snap, &RestoreLimits::default(), &MODULE, &path).unwrap();
    assert_eq!(got, meta);
    let image = LocalImage::open(&path, &RestoreLimits::default(), &MODULE).unwrap();
    let mut out = AnonymousPages::new(memory.len()).unwrap();
    map_into(&image, out.as_mut_slice()).unwrap();
    assert!(out.as_slice() == &memory[..]);
    // No partial file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn foreign_module_is_refused_by_both_encodings() {
    let dir = tempfile::tempdir().unwrap();
    let memory = realistic_image(65_536, 8);
    let meta = meta_for(&memory);
    let snap = capture_portable(&meta, &memory, &CaptureOptions::default()).unwrap();
    let other = [0u8; 32];
    assert!(matches!(
        restore_portable(&snap, &RestoreLimits::default(), &other),
        Err(SnapshotError::ModuleMismatch)
    ));
    let path = dir.path().join("i");
    write_local(&meta, &memory, &path).unwrap();
    assert!(matches!(
        LocalImage::open(&path, &RestoreLimits::default(), &other),
        Err(SnapshotError::ModuleMismatch)
    ));
}

#[test]
fn wrong_magic_version_and_lengths_are_named() {
    let memory = realistic_image(65_536, 8);
    let snap = capture_portable(&meta_for(&memory), &memory, &CaptureOptions::default()).unwrap();
    let limits = RestoreLimits::default();
    let mut bad = snap.clone();
    bad[0] = b'X';
    assert!(matches!(
        restore_portable(&bad, &limits, &MODULE),
        Err(SnapshotError::BadMagic)
    ));
    let mut bad = snap.clone();
    bad[8] = 2;
    assert!(matches!(
        restore_portable(&bad, &limits, &MODULE),
        Err(SnapshotError::UnsupportedVersion { found: 2, .. })
    ));
    assert!(matches!(
        restore_portable(&snap[..snap.len() - 1], &limits, &MODULE),
        Err(SnapshotError::Truncated(_))
    ));
    assert!(matches!(
        restore_portable(&snap[..40], &limits, &MODULE),
        Err(SnapshotError::Truncated("header"))
    ));
    let mut bad = snap.clone();
    bad[PORTABLE_HEADER_LEN + 2] ^= 1;
    assert!(matches!(
        restore_portable(&bad, &limits, &MODULE),
        Err(SnapshotError::ChecksumMismatch {
            section: "metadata"
        })
    ));
    let mut bad = snap.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x80;
    assert!(matches!(
        restore_portable(&bad, &limits, &MODULE),
        Err(SnapshotError::ChecksumMismatch { section: "frame" })
    ));
}

#[test]
fn local_data_corruption_is_caught_by_eager_paths() {
    let dir = tempfile::tempdir().unwrap();
    let memory = realistic_image(1 << 20, 21);
    let path = dir.path().join("i");
    write_local(&meta_for(&memory), &memory, &path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let last_nonzero = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[last_nonzero] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let image = LocalImage::open(&path, &RestoreLimits::default(), &MODULE).unwrap();
    assert!(matches!(
        image.verify(),
        Err(SnapshotError::ChecksumMismatch { section: "data" })
    ));
    let mut out = vec![0u8; memory.len()];
    assert!(matches!(
        image.read_into(&mut out),
        Err(SnapshotError::ChecksumMismatch { section: "data" })
    ));
}

/// [`LocalImage::map_for_reads`] on the images these tests write.
#[allow(unsafe_code)]
fn map_for_reads(image: &mut LocalImage) {
    // SAFETY: as in `map_into`: the image is written once before it is opened and nothing
    // truncates or rewrites it while the image lives.
    unsafe { image.map_for_reads() }.unwrap();
}

/// Eager restores of images large enough for one thread per core (runs split between the
/// threads), read from the file or from its mapping, give the image back byte for byte over
/// any previous contents; a flipped bit in any run, the first, one in the middle of a split
/// run or the last, is caught either way.
#[test]
fn eager_restores_by_every_core_from_file_or_mapping_are_exact_and_checked_until_verified() {
    let dir = tempfile::tempdir().unwrap();
    let mut memory = realistic_image(24 << 20, 5);
    // One long run across the middle, where the shares of two threads meet.
    memory[10 << 20..14 << 20].fill(0x77);
    let path = dir.path().join("big");
    write_local(&meta_for(&memory), &memory, &path).unwrap();
    for mapped in [false, true] {
        let mut image = LocalImage::open(&path, &RestoreLimits::default(), &MODULE).unwrap();
        if mapped {
            map_for_reads(&mut image);
        }
        let mut out = vec![0xEEu8; memory.len() + 4096];
        image.read_into(&mut out).unwrap();
        assert!(out[..memory.len()] == memory[..], "mapped: {mapped}");
        assert!(
            out[memory.len()..].iter().all(|&b| b == 0xEE),
            "past the image"
        );
        // The verified image's copy without checksums gives the same bytes, over any
        // destination content.
        image.verify().unwrap();
        let mut out = vec![0x11u8; memory.len() + 4096];
        image.read_verified_into(&mut out).unwrap();
        assert!(
            out[..memory.len()] == memory[..],
            "verified, mapped: {mapped}"
        );
        assert!(out[memory.len()..].iter().all(|&b| b == 0x11));
    }
    let clean = std::fs::read(&path).unwrap();
    let data_start = clean.len() - memory.len();
    let nonzero: Vec<usize> = (0..memory.len()).filter(|&i| memory[i] != 0).collect();
    for at in [nonzero[0], 12 << 20, *nonzero.last().unwrap()] {
        let mut bytes = clean.clone();
        bytes[data_start + at] ^= 1;
        let corrupt = dir.path().join(format!("corrupt-{at}"));
        std::fs::write(&corrupt, &bytes).unwrap();
        for mapped in [false, true] {
            let mut image = LocalImage::open(&corrupt, &RestoreLimits::default(), &MODULE).unwrap();
            if mapped {
                map_for_reads(&mut image);
            }
            let mut out = vec![0u8; memory.len()];
            assert!(
                matches!(
                    image.read_into(&mut out),
                    Err(SnapshotError::ChecksumMismatch { section: "data" })
                ),
                "flipped byte {at}, mapped: {mapped}"
            );
            // Not verified: the copy that trusts a verified image still checks this one.
            assert!(
                matches!(
                    image.read_verified_into(&mut out),
                    Err(SnapshotError::ChecksumMismatch { section: "data" })
                ),
                "unverified, flipped byte {at}, mapped: {mapped}"
            );
            assert!(image.verify().is_err());
            assert!(image.read_verified_into(&mut out).is_err());
        }
    }
}

/// A small snapshot with several frames (64 KiB chunks) shared by the property tests.
fn small_snapshot() -> (Vec<u8>, Vec<u8>) {
    let memory = realistic_image(320 * 1024, 77);
    let options = CaptureOptions {
        chunk_size: 65_536,
        ..CaptureOptions::default()
    };
    let snap = capture_portable(&meta_for(&memory), &memory, &options).unwrap();
    (memory, snap)
}

/// Limits no larger than the original image: a decoder that honours them cannot allocate an
/// image larger than the one captured.
fn tight_limits(memory: &[u8]) -> RestoreLimits {
    RestoreLimits {
        max_memory_bytes: memory.len() as u64,
        max_meta_bytes: 4096,
    }
}

fn check_portable(bytes: &[u8], memory: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((meta, back)) = restore_portable(bytes, &tight_limits(memory), &MODULE) {
        prop_assert_eq!(meta, meta_for(memory));
        prop_assert!(back == memory, "decoded a different image without an error");
    }
    Ok(())
}

/// Rewrites a header field and recomputes the header checksum, so that the checks behind
/// the checksum (limits, lengths, frame table) are exercised too.
fn rewrite_header(snap: &mut [u8], at: usize, value: u64, width: usize) {
    snap[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    let crc = crc32c(&snap[..60]);
    snap[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// Bitwise CRC-32C (Castagnoli), independent of the crate's implementation.
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
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn truncated_portable_never_decodes(cut in 0usize..1_000_000) {
        let (memory, snap) = small_snapshot();
        let cut = cut % snap.len();
        prop_assert!(restore_portable(&snap[..cut], &tight_limits(&memory), &MODULE).is_err());
    }

    #[test]
    fn bit_flipped_portable_errs_or_is_exact(flips in prop::collection::vec((any::<usize>(), 0u8..8), 1..6)) {
        let (memory, mut snap) = small_snapshot();
        for (at, bit) in flips {
            let at = at % snap.len();
            snap[at] ^= 1 << bit;
        }
        check_portable(&snap, &memory)?;
    }

    #[test]
    fn rewritten_header_fields_are_checked(field in 0usize..7, value in any::<u64>()) {
        let (memory, mut snap) = small_snapshot();
        let (at, width) = [(12, 4), (16, 4), (20, 4), (24, 8), (32, 8), (40, 8), (48, 4)][field];
        rewrite_header(&mut snap, at, value, width);
        check_portable(&snap, &memory)?;
    }

    #[test]
    fn garbage_after_a_valid_header_never_panics(tail in prop::collection::vec(any::<u8>(), 0..4096)) {
        let (memory, snap) = small_snapshot();
        let mut bytes = snap[..PORTABLE_HEADER_LEN].to_vec();
        bytes.extend_from_slice(&tail);
        check_portable(&bytes, &memory)?;
    }

    #[test]
    fn corrupted_local_image_errs_or_is_exact(
        flips in prop::collection::vec((any::<usize>(), 0u8..8), 1..4),
        cut in prop::option::of(any::<usize>()),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let memory = realistic_image(256 * 1024, 31);
        let path = dir.path().join("i");
        write_local(&meta_for(&memory), &memory, &path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, bit) in flips {
            let at = at % bytes.len();
            bytes[at] ^= 1 << bit;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % bytes.len());
        }
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(image) = LocalImage::open(&path, &tight_limits(&memory), &MODULE) {
            prop_assert_eq!(image.meta(), &meta_for(&memory));
            let mut out = vec![0u8; memory.len()];
            if image.read_into(&mut out).is_ok() {
                prop_assert!(out == memory, "read a different image without an error");
            }
        }
    }
}
