//! Unit tests of the portable encoding's internals: the frames built here decode with zstd,
//! page classification, the frame bound per chunk, and damage behind valid checksums. The
//! round trips and hostile inputs through the public API are in `tests/`.

use super::frames::{
    encode_chunk, looks_incompressible, page_kind, push_stored_frame, stored_frame_len, PageKind,
    STORED_FRAME_HEADER_LEN, ZSTD_BLOCK_MAX,
};
use super::layout::{
    parse_header, put_u32, read_frame_table, FRAME_ENTRY_LEN, MIN_CHUNK, PORTABLE_HEADER_LEN,
};
use super::{capture_portable, restore_portable, CaptureOptions, PortableEncoder};
use crate::image::{is_zero, IMAGE_PAGE};
use crate::{realistic_image, RestoreLimits, SnapshotError, SnapshotMeta};

fn meta(len: usize) -> SnapshotMeta {
    SnapshotMeta::new([1; 32], "fn", "acme", len as u64)
}

/// `len` bytes of random little-endian `f32`s in [-1, 1) (as in `realistic_image`).
fn floats(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 4);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let v = (r >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `len` bytes of log-like ASCII text.
fn text(len: usize, seed: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = ["tensor", "ok", "latency", "the", "gpu", "value", ": ", "\n"];
    let mut out = Vec::with_capacity(len + 8);
    let mut i = seed;
    while out.len() < len {
        out.extend_from_slice(WORDS[(i * 7 + i / 3) % 8].as_bytes());
        out.push(b' ');
        i += 1;
    }
    out.truncate(len);
    out
}

/// Splits zstd data into its frames: (bytes, content size).
fn frames_of(mut data: &[u8]) -> Vec<(usize, usize)> {
    let mut frames = Vec::new();
    while !data.is_empty() {
        let len = zstd::zstd_safe::find_frame_compressed_size(data).unwrap();
        let content = zstd::zstd_safe::get_frame_content_size(data).unwrap();
        frames.push((len, content.unwrap() as usize));
        data = &data[len..];
    }
    frames
}

#[test]
fn stored_frames_decode_with_zstd() {
    let sizes = [
        0,
        1,
        4096,
        ZSTD_BLOCK_MAX - 1,
        ZSTD_BLOCK_MAX,
        ZSTD_BLOCK_MAX + 1,
        2 * ZSTD_BLOCK_MAX,
        (1 << 20) + 5,
    ];
    for len in sizes {
        for kind in [PageKind::Raw, PageKind::Zero] {
            let data = if kind == PageKind::Raw {
                floats(len, len as u64)
            } else {
                vec![0; len]
            };
            let mut frame = vec![0xee]; // appends after existing bytes
            push_stored_frame(&mut frame, &data, kind);
            let frame = &frame[1..];
            if kind == PageKind::Raw {
                assert_eq!(frame.len(), stored_frame_len(len));
            }
            assert_eq!(frame[..4], [0x28, 0xb5, 0x2f, 0xfd]);
            assert_eq!(
                zstd::zstd_safe::get_frame_content_size(frame).unwrap(),
                Some(len as u64)
            );
            assert_eq!(
                zstd::zstd_safe::find_frame_compressed_size(frame).unwrap(),
                frame.len()
            );
            assert_eq!(zstd::bulk::decompress(frame, len).unwrap(), data);
            // The restore path: a decompressor into a buffer of exactly the content size.
            let mut out = vec![0x55; len];
            let written = zstd::bulk::Decompressor::new()
                .unwrap()
                .decompress_to_buffer(frame, &mut out)
                .unwrap();
            assert_eq!(written, len);
            assert!(out == data, "{kind:?} frame of {len} bytes");
        }
    }
}

#[test]
fn pages_are_classified_by_content() {
    assert_eq!(page_kind(&[0; IMAGE_PAGE]), PageKind::Zero);
    assert_eq!(page_kind(&floats(IMAGE_PAGE, 3)), PageKind::Raw);
    assert_eq!(page_kind(&text(IMAGE_PAGE, 3)), PageKind::Compress);
    // A page that is half floats, half text, and a partial page of floats, go to zstd.
    let mut half = floats(IMAGE_PAGE / 2, 4);
    half.extend(text(IMAGE_PAGE / 2, 4));
    assert_eq!(page_kind(&half), PageKind::Compress);
    assert_eq!(page_kind(&floats(IMAGE_PAGE - 1, 5)), PageKind::Compress);
    // Every random-float and no text page of a realistic image looks incompressible.
    let image = realistic_image(8 << 20, 17);
    for page in image.chunks(IMAGE_PAGE).filter(|p| !is_zero(p)) {
        let is_text = page.iter().all(u8::is_ascii);
        assert_eq!(looks_incompressible(page), !is_text);
    }
}

#[test]
fn mixed_chunk_is_concatenated_frames_one_zstd_call_decodes() {
    let mut chunk = vec![0u8; 2 * IMAGE_PAGE];
    chunk.extend(floats(3 * IMAGE_PAGE, 1));
    chunk.extend(text(2 * IMAGE_PAGE, 1));
    chunk.extend(vec![0u8; IMAGE_PAGE]);
    chunk.extend(floats(40 * IMAGE_PAGE, 2)); // more than one 128 KiB block
    chunk.extend(text(IMAGE_PAGE + 100, 2)); // ends in a partial page
    let mut compressor = zstd::bulk::Compressor::new(1).unwrap();
    let mut out = Vec::new();
    encode_chunk(&mut compressor, &chunk, &mut out).unwrap();
    let rle = |pages: usize| (STORED_FRAME_HEADER_LEN + 4, pages * IMAGE_PAGE);
    let raw = |pages: usize| (stored_frame_len(pages * IMAGE_PAGE), pages * IMAGE_PAGE);
    let frames = frames_of(&out);
    assert_eq!(frames.len(), 6, "{frames:?}");
    assert_eq!(frames[..2], [rle(2), raw(3)]);
    assert_eq!(frames[3..5], [rle(1), raw(40)]);
    for text_frame in [frames[2], frames[5]] {
        assert!(
            text_frame.0 < text_frame.1 / 2,
            "text is compressed: {frames:?}"
        );
    }
    // What `restore_portable` (and every version-1 reader) does with a chunk's data.
    let mut back = vec![0xaa; chunk.len()];
    let written = zstd::bulk::Decompressor::new()
        .unwrap()
        .decompress_to_buffer(&out[..], &mut back)
        .unwrap();
    assert_eq!(written, chunk.len());
    assert!(back == chunk);
}

#[test]
fn uniform_chunks_are_one_frame() {
    let mut compressor = zstd::bulk::Compressor::new(1).unwrap();
    // A chunk with nothing incompressible is the same single zstd frame as before.
    let chunk = text(1 << 20, 9);
    let mut out = Vec::new();
    encode_chunk(&mut compressor, &chunk, &mut out).unwrap();
    assert_eq!(out, zstd::bulk::compress(&chunk, 1).unwrap());
    // An incompressible one is a single raw frame; an all-zero one is empty.
    let chunk = floats(1 << 20, 9);
    out.clear();
    encode_chunk(&mut compressor, &chunk, &mut out).unwrap();
    assert_eq!(
        frames_of(&out),
        [(stored_frame_len(chunk.len()), chunk.len())]
    );
    out.clear();
    encode_chunk(&mut compressor, &[0; 1 << 20], &mut out).unwrap();
    assert!(out.is_empty());
}

#[test]
fn page_by_page_alternation_stays_within_the_frame_bound() {
    // The most frames a chunk can hold: the kind changes on every page.
    for chunk_size in [MIN_CHUNK, 16 << 10, 1 << 20] {
        let mut memory = Vec::new();
        for (i, page) in (0..(4 << 20) / IMAGE_PAGE).enumerate() {
            match i % 4 {
                0 => memory.extend(floats(IMAGE_PAGE, page as u64)),
                1 => memory.extend(vec![0; IMAGE_PAGE]),
                2 => memory.extend(text(IMAGE_PAGE, page)),
                _ => memory.extend(floats(IMAGE_PAGE - 8, page as u64).iter().chain(&[0; 8])),
            }
        }
        let options = CaptureOptions {
            chunk_size,
            ..CaptureOptions::default()
        };
        let snap = capture_portable(&meta(memory.len()), &memory, &options).unwrap();
        let limits = RestoreLimits::default();
        let header = parse_header(&snap, &limits).unwrap();
        for frame in read_frame_table(&snap, &header).unwrap() {
            assert!(frame.len <= stored_frame_len(chunk_size as usize));
        }
        let (_, back) = restore_portable(&snap, &limits, &[1; 32]).unwrap();
        assert!(back == memory, "chunk size {chunk_size}");
    }
}

/// Rewrites frame `index`'s bytes with `edit`, then fixes its CRC, the table CRC and the
/// header CRC, so that only the zstd decoder can notice.
fn edit_frame(snap: &mut [u8], index: usize, edit: impl FnOnce(&mut [u8])) {
    let header = parse_header(snap, &RestoreLimits::default()).unwrap();
    let frame = read_frame_table(snap, &header).unwrap()[index];
    edit(&mut snap[frame.start..frame.start + frame.len]);
    let crc = crc32c::crc32c(&snap[frame.start..frame.start + frame.len]);
    let table_start = PORTABLE_HEADER_LEN + header.meta_len;
    put_u32(snap, table_start + index * FRAME_ENTRY_LEN + 12, crc);
    let table_end = table_start + header.chunk_count * FRAME_ENTRY_LEN;
    let table_crc = crc32c::crc32c(&snap[table_start..table_end]);
    put_u32(snap, 52, table_crc);
    let header_crc = crc32c::crc32c(&snap[..60]);
    put_u32(snap, 60, header_crc);
}

#[test]
fn corrupted_stored_frames_are_refused() {
    let memory = floats(256 << 10, 7); // two chunks of one raw frame each
    let options = CaptureOptions {
        chunk_size: 128 << 10,
        ..CaptureOptions::default()
    };
    let snap = capture_portable(&meta(memory.len()), &memory, &options).unwrap();
    let limits = RestoreLimits::default();
    let frame = read_frame_table(&snap, &parse_header(&snap, &limits).unwrap()).unwrap()[1];
    assert_eq!(frame.len, stored_frame_len(128 << 10));
    let restore = |snap: &[u8]| restore_portable(snap, &limits, &[1; 32]);
    assert!(restore(&snap).unwrap().1 == memory);

    // A payload byte changed without fixing the CRC.
    let mut bad = snap.clone();
    bad[frame.start + 100] ^= 1;
    assert!(matches!(
        restore(&bad),
        Err(SnapshotError::ChecksumMismatch { section: "frame" })
    ));
    // Structural damage behind valid CRCs: each is refused by zstd or the length check.
    type Edit = fn(&mut [u8]);
    let edits: [(&str, Edit); 5] = [
        ("reserved block type", |f| f[9] |= 0b110),
        ("block size one less", |f| f[10] = f[10].wrapping_sub(1)),
        ("content size one more", |f| f[5] = f[5].wrapping_add(1)),
        ("last-block flag cleared", |f| f[9] &= !1),
        ("bad magic", |f| f[0] ^= 0x10),
    ];
    for (what, edit) in edits {
        let mut bad = snap.clone();
        edit_frame(&mut bad, 1, edit);
        assert!(
            matches!(restore(&bad), Err(SnapshotError::Corrupt(_))),
            "{what}"
        );
    }
}

#[test]
fn zero_chunks_are_empty_frames() {
    let memory = vec![0u8; 4 << 20];
    let snap = capture_portable(&meta(memory.len()), &memory, &CaptureOptions::default()).unwrap();
    assert!(
        snap.len() < 1024,
        "all-zero image took {} bytes",
        snap.len()
    );
    let (_, back) = restore_portable(&snap, &RestoreLimits::default(), &[1; 32]).unwrap();
    assert_eq!(back, memory);
}

#[test]
fn single_thread_and_small_chunks_round_trip() {
    let memory = realistic_image(3 * 65_536, 9);
    let options = CaptureOptions {
        chunk_size: 4096,
        zstd_level: 1,
        threads: 1,
    };
    let snap = capture_portable(&meta(memory.len()), &memory, &options).unwrap();
    let (_, back) = restore_portable(&snap, &RestoreLimits::default(), &[1; 32]).unwrap();
    assert_eq!(back, memory);
}

#[test]
fn declared_size_over_limit_is_refused_before_allocation() {
    let memory = realistic_image(1 << 20, 2);
    let snap = capture_portable(&meta(memory.len()), &memory, &CaptureOptions::default()).unwrap();
    let limits = RestoreLimits {
        max_memory_bytes: (1 << 20) - 1,
        ..RestoreLimits::default()
    };
    assert!(matches!(
        restore_portable(&snap, &limits, &[1; 32]),
        Err(SnapshotError::TooLarge {
            what: "memory image",
            ..
        })
    ));
}

#[test]
fn bad_options_and_mismatched_meta_are_refused() {
    let memory = vec![0u8; 65_536];
    let bad = CaptureOptions {
        chunk_size: 3000,
        ..CaptureOptions::default()
    };
    assert!(matches!(
        capture_portable(&meta(memory.len()), &memory, &bad),
        Err(SnapshotError::InvalidInput(_))
    ));
    assert!(matches!(
        capture_portable(&meta(1), &memory, &CaptureOptions::default()),
        Err(SnapshotError::InvalidInput(_))
    ));
}

#[test]
fn a_reused_encoder_gives_the_bytes_of_a_fresh_one() {
    // Captures of different sizes, thread counts and chunk sizes through one encoder, with an
    // error and a shrink between them: each equals a fresh capture and round-trips.
    let mut encoder = PortableEncoder::new();
    let cases = [
        (3 << 20, 0, 1 << 20),
        (64 << 10, 1, 4 << 10),
        (5 << 20, 3, 256 << 10),
        (0, 0, 1 << 20),
        (2 << 20, 2, 64 << 10),
    ];
    for (round, &(len, threads, chunk_size)) in cases.iter().enumerate() {
        let memory = realistic_image(len, round as u64 + 1);
        let options = CaptureOptions {
            chunk_size,
            threads,
            ..CaptureOptions::default()
        };
        let meta = meta(len);
        let fresh = capture_portable(&meta, &memory, &options).unwrap();
        let encoded = encoder.encode(&meta, &memory, &options).unwrap();
        assert_eq!(encoded.len(), fresh.len(), "round {round}");
        assert!(encoded.to_vec() == fresh, "round {round}");
        let mut written = Vec::new();
        encoded.write_to(&mut written).unwrap();
        assert!(written == fresh, "round {round}");
        let (_, back) = restore_portable(&fresh, &RestoreLimits::default(), &[1; 32]).unwrap();
        assert!(back == memory, "round {round}");

        // A refused capture leaves the encoder usable.
        let mut wrong = meta.clone();
        wrong.memory_size_bytes += 1;
        assert!(encoder.encode(&wrong, &memory, &options).is_err());
        if round == 2 {
            encoder.shrink_to(1 << 20);
            assert!(encoder.retained_bytes() <= 1 << 20);
        }
    }
    assert!(encoder.retained_bytes() > 0);
    encoder.shrink_to(0);
    assert_eq!(encoder.retained_bytes(), 0);
}

#[test]
fn a_small_image_is_cut_in_one_chunk_per_thread() {
    // 1 MiB with the default 1 MiB chunk on 4 threads: 256 KiB chunks, four frames.
    let memory = realistic_image(1 << 20, 9);
    let options = CaptureOptions {
        threads: 4,
        ..CaptureOptions::default()
    };
    let snap = capture_portable(&meta(memory.len()), &memory, &options).unwrap();
    let header = parse_header(&snap, &RestoreLimits::default()).unwrap();
    assert_eq!(header.chunk_size, 256 << 10);
    let (_, back) = restore_portable(&snap, &RestoreLimits::default(), &[1; 32]).unwrap();
    assert!(back == memory);
    // Never below the floor, and a chunk size already below it is kept.
    for (len, chunk, threads, expected) in [
        (128 << 10, 1 << 20, 8, super::SPLIT_FLOOR as usize),
        (64 << 10, 16 << 10, 8, 16 << 10),
        (8 << 20, 1 << 20, 2, 1 << 20),
    ] {
        let memory = vec![1u8; len];
        let options = CaptureOptions {
            chunk_size: chunk,
            threads,
            ..CaptureOptions::default()
        };
        let snap = capture_portable(&meta(len), &memory, &options).unwrap();
        let header = parse_header(&snap, &RestoreLimits::default()).unwrap();
        assert_eq!(
            header.chunk_size, expected,
            "{len} bytes, {chunk}, {threads} threads"
        );
    }
}
