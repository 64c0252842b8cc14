//! Single-thread costs behind the stored-frame encoder of the portable format (the choices in
//! the `portable` module documentation), on the pages of a 64 MiB realistic image
//! (`realistic_image`, seed 1): 8 MiB of its ASCII-text pages, 8 MiB of its random-float pages
//! and, for the chunk encoders, its first 32 MiB in 1 MiB chunks. Throughput is of input bytes.
//!
//! Ids (group `stored_frames`):
//! - `classify/16MiB`: `page_kind` of every text and float page;
//! - `compress_text/{1,-1,-3,-5}` and `compress_floats/1`: zstd at that level, 1 MiB at a time;
//! - `encode_chunks/{one_zstd_frame,stored_frames}`: the chunk encoder before stored frames
//!   (one level-1 zstd frame per non-zero chunk) and the current one (`encode_chunk`);
//! - `decode_chunks/{one_zstd_frame,stored_frames}`: zstd decoding what each wrote, into a
//!   reused buffer (no page faults);
//! - `raw_frames/{push,decode}`: the float pages as raw frames (`push_stored_frame`), and their
//!   decoding by zstd, beside `memcpy/8MiB`, a copy of the same bytes (direct-copy peer);
//! - `rle_frames/decode`: zstd decoding 8 MiB of all-zero RLE frames, beside
//!   `memset_vec_peer/8MiB`, a fill of the same bytes (direct peer).
//!
//! Before the measurements it prints (once) what is not a time: the share of
//! incompressible-looking pages per chunk, the sampled and whole-page entropies of text, float
//! and executable pages against the raw-storage threshold, compression ratios, and the portable
//! size of the whole image. `bench-results/2026-11-21-snapshot-stored-frames-costs.txt` holds
//! the output of the same measurements as an ignored test, before they became this bench.

use std::cell::OnceCell;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor_wasm_snapshot::bench_internals::{
    encode_chunk, is_zero, looks_incompressible, page_kind, push_stored_frame, sample_entropy,
    PageKind,
};
use tensor_wasm_snapshot::{
    capture_portable, realistic_image, CaptureOptions, SnapshotMeta, IMAGE_PAGE,
};

const MB: usize = 1 << 20;

/// The inputs, built once, when the first id runs (a filtered run that matches none of this
/// bench's ids, such as `bench-gate`'s confirmation re-run, skips them and the report).
struct Inputs {
    image: Vec<u8>,
    /// 8 MiB of the image's text pages, and 8 MiB of its float pages.
    text: Vec<u8>,
    floats: Vec<u8>,
    /// What the chunk encoders before and after stored frames make of the first 32 MiB of
    /// the image, per 1 MiB chunk.
    before: Vec<Vec<u8>>,
    after: Vec<Vec<u8>>,
    /// The float pages as raw frames, and 8 MiB of zeros as RLE frames, one per MiB.
    raw_frames: Vec<Vec<u8>>,
    rle_frames: Vec<Vec<u8>>,
}

impl Inputs {
    fn new() -> Self {
        let image = realistic_image(64 << 20, 1);
        let pages = |text: bool| -> Vec<u8> {
            let class = image
                .chunks(IMAGE_PAGE)
                .filter(|p| !is_zero(p) && p.iter().all(u8::is_ascii) == text);
            class.flatten().copied().take(8 * MB).collect()
        };
        let (text, floats) = (pages(true), pages(false));
        let mut level1 = zstd::bulk::Compressor::new(1).expect("compressor");
        let chunks = image[..32 * MB].chunks(MB);
        let before = chunks
            .clone()
            .map(|c| encode_before(&mut level1, c))
            .collect();
        let after = chunks.map(|c| encode_after(&mut level1, c)).collect();
        let raw_frames = stored(&floats, PageKind::Raw);
        let rle_frames = stored(&vec![0u8; 8 * MB], PageKind::Zero);
        Self {
            image,
            text,
            floats,
            before,
            after,
            raw_frames,
            rle_frames,
        }
    }
}

/// The chunk encoder before stored frames: one level-1 zstd frame per non-zero chunk.
fn encode_before(c: &mut zstd::bulk::Compressor<'_>, chunk: &[u8]) -> Vec<u8> {
    if is_zero(chunk) {
        Vec::new()
    } else {
        c.compress(chunk).expect("compress")
    }
}

/// The current chunk encoder.
fn encode_after(c: &mut zstd::bulk::Compressor<'_>, chunk: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_chunk(c, chunk, &mut out).expect("encode");
    out
}

/// One stored frame of `kind` per MiB of `data`.
fn stored(data: &[u8], kind: PageKind) -> Vec<Vec<u8>> {
    let frame = |c: &[u8]| {
        let mut f = Vec::new();
        push_stored_frame(&mut f, c, kind);
        f
    };
    data.chunks(MB).map(frame).collect()
}

/// Prints what the benchmark's choices rest on besides time.
fn report(inputs: &Inputs) {
    let Inputs {
        image,
        text,
        floats,
        ..
    } = inputs;
    // How often a whole-chunk decision ("store the chunk raw if it barely compresses")
    // would apply: the share of incompressible-looking pages per 1 MiB chunk.
    let mut shares: Vec<usize> = image
        .chunks(MB)
        .map(|c| {
            let raw = c
                .chunks(IMAGE_PAGE)
                .filter(|p| page_kind(p) == PageKind::Raw);
            raw.count() * 100 / (MB / IMAGE_PAGE)
        })
        .collect();
    shares.sort_unstable();
    eprintln!(
        "stored_frames: incompressible-looking pages per 1 MiB chunk: min {} %, median {} %, max {} % ({} chunks)",
        shares[0],
        shares[shares.len() / 2],
        shares[shares.len() - 1],
        shares.len()
    );
    // Where pages fall against the raw-storage threshold: the sample estimate and the whole
    // page's entropy, for the text and random-f32 pages of the image and the full pages of this
    // bench executable (machine code and data).
    let whole_page_entropy = |page: &[u8]| {
        let mut counts = [0usize; 256];
        page.iter().for_each(|&b| counts[usize::from(b)] += 1);
        let n = page.len() as f64;
        let h: f64 = counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| -(c as f64 / n) * (c as f64 / n).log2())
            .sum();
        h as f32 + 0.0 // no "-0.00" for a constant page
    };
    let range = |pages: &mut dyn Iterator<Item = &[u8]>, f: &dyn Fn(&[u8]) -> f32| {
        pages.fold((f32::MAX, f32::MIN), |(lo, hi), p| {
            (lo.min(f(p)), hi.max(f(p)))
        })
    };
    let exe = std::fs::read("/proc/self/exe").unwrap_or_default();
    for (name, data) in [
        ("text", text),
        ("random-f32", floats),
        ("bench executable", &exe),
    ] {
        let (s_lo, s_hi) = range(&mut data.chunks_exact(IMAGE_PAGE), &sample_entropy);
        let (w_lo, w_hi) = range(&mut data.chunks_exact(IMAGE_PAGE), &whole_page_entropy);
        let raw = data
            .chunks_exact(IMAGE_PAGE)
            .filter(|p| looks_incompressible(p));
        eprintln!(
            "stored_frames: {name} pages ({}): sample entropy {s_lo:.2}-{s_hi:.2} bits/byte, whole-page entropy {w_lo:.2}-{w_hi:.2}, stored raw: {}",
            data.len() / IMAGE_PAGE,
            raw.count()
        );
    }
    // Compression ratios of the zstd levels timed below.
    for (name, data, level) in [
        ("text", text, 1),
        ("text", text, -1),
        ("text", text, -3),
        ("text", text, -5),
        ("floats", floats, 1),
    ] {
        let mut c = zstd::bulk::Compressor::new(level).expect("compressor");
        let bytes: usize = data
            .chunks(MB)
            .map(|m| c.compress(m).expect("compress").len())
            .sum();
        eprintln!(
            "stored_frames: compress {name}, zstd level {level}: ratio {:.3}",
            bytes as f64 / data.len() as f64
        );
    }
    // Portable size of the whole image, against one level-1 frame per non-empty chunk
    // (the encoder before stored frames).
    let one_frame: usize = image
        .chunks(MB)
        .filter(|c| !is_zero(c))
        .map(|c| zstd::bulk::compress(c, 1).expect("compress").len())
        .sum();
    let meta = SnapshotMeta::new([1; 32], "fn", "acme", image.len() as u64);
    let snap = capture_portable(&meta, image, &CaptureOptions::default()).expect("capture");
    eprintln!(
        "stored_frames: portable size of the 64 MiB image: {} bytes ({:.3} of the image); frames alone as one level-1 frame per chunk: {} bytes ({:.3})",
        snap.len(),
        snap.len() as f64 / image.len() as f64,
        one_frame,
        one_frame as f64 / image.len() as f64
    );
}

fn stored_frames(c: &mut Criterion) {
    let inputs = OnceCell::new();
    let inputs = || {
        inputs.get_or_init(|| {
            let inputs = Inputs::new();
            report(&inputs);
            inputs
        })
    };
    let mut group = c.benchmark_group("stored_frames");
    // Each iteration handles 8-32 MiB (tens of milliseconds): ten samples fit the CI window.
    group.sample_size(10);

    group.throughput(Throughput::Bytes(16 * MB as u64));
    group.bench_function(BenchmarkId::new("classify", "16MiB"), |b| {
        let Inputs { text, floats, .. } = inputs();
        let nonzero: Vec<&[u8]> = text
            .chunks(IMAGE_PAGE)
            .chain(floats.chunks(IMAGE_PAGE))
            .collect();
        b.iter(|| {
            for p in &nonzero {
                black_box(page_kind(p));
            }
        });
    });

    for (name, level) in [
        ("compress_text", 1),
        ("compress_text", -1),
        ("compress_text", -3),
        ("compress_text", -5),
        ("compress_floats", 1),
    ] {
        group.throughput(Throughput::Bytes(8 * MB as u64));
        group.bench_function(BenchmarkId::new(name, level), |b| {
            let i = inputs();
            let data = if name == "compress_text" {
                &i.text
            } else {
                &i.floats
            };
            let mut compressor = zstd::bulk::Compressor::new(level).expect("compressor");
            b.iter(|| {
                data.chunks(MB)
                    .map(|m| compressor.compress(m).expect("compress").len())
                    .sum::<usize>()
            });
        });
    }

    // The chunk encoders before and after stored frames, on 32 MiB of the image, 1 MiB
    // chunks, and the decoding of what they produce (into a reused buffer: no page faults).
    group.throughput(Throughput::Bytes(32 * MB as u64));
    type Encoder = fn(&mut zstd::bulk::Compressor<'_>, &[u8]) -> Vec<u8>;
    let encoders: [(&str, Encoder); 2] = [
        ("one_zstd_frame", encode_before),
        ("stored_frames", encode_after),
    ];
    for (name, encode) in encoders {
        group.bench_function(BenchmarkId::new("encode_chunks", name), |b| {
            let chunks: Vec<&[u8]> = inputs().image[..32 * MB].chunks(MB).collect();
            let mut level1 = zstd::bulk::Compressor::new(1).expect("compressor");
            b.iter(|| {
                for chunk in &chunks {
                    black_box(encode(&mut level1, chunk));
                }
            });
        });
    }
    let mut out = vec![1u8; MB];
    let mut decompressor = zstd::bulk::Decompressor::new().expect("decompressor");
    for (name, _) in encoders {
        group.bench_function(BenchmarkId::new("decode_chunks", name), |b| {
            let i = inputs();
            let frames = if name == "one_zstd_frame" {
                &i.before
            } else {
                &i.after
            };
            b.iter(|| {
                for f in frames.iter().filter(|f| !f.is_empty()) {
                    decompressor
                        .decompress_to_buffer(&f[..], &mut out)
                        .expect("decode");
                }
            });
        });
    }

    // Stored frames against the direct operation they stand for.
    group.throughput(Throughput::Bytes(8 * MB as u64));
    group.bench_function(BenchmarkId::new("raw_frames", "push"), |b| {
        let floats = &inputs().floats;
        b.iter(|| {
            // A fresh buffer per iteration, reused across its chunks.
            let mut f = Vec::new();
            for m in floats.chunks(MB) {
                f.clear();
                push_stored_frame(&mut f, m, PageKind::Raw);
                black_box(&f);
            }
        });
    });
    group.bench_function(BenchmarkId::new("raw_frames", "decode"), |b| {
        let raw_frames = &inputs().raw_frames;
        b.iter(|| {
            for f in raw_frames {
                decompressor
                    .decompress_to_buffer(&f[..], &mut out)
                    .expect("decode");
            }
        });
    });
    group.bench_function(BenchmarkId::new("memcpy", "8MiB"), |b| {
        let floats = &inputs().floats;
        b.iter(|| {
            for m in floats.chunks(MB) {
                out.copy_from_slice(black_box(m));
            }
        });
    });
    group.bench_function(BenchmarkId::new("rle_frames", "decode"), |b| {
        let rle_frames = &inputs().rle_frames;
        b.iter(|| {
            for f in rle_frames {
                decompressor
                    .decompress_to_buffer(&f[..], &mut out)
                    .expect("decode");
            }
        });
    });
    group.bench_function(BenchmarkId::new("memset_vec_peer", "8MiB"), |b| {
        let frames = inputs().rle_frames.len();
        b.iter(|| {
            for _ in 0..frames {
                black_box(&mut out).fill(0);
            }
        });
    });
    group.finish();
}

criterion_group!(benches, stored_frames);
criterion_main!(benches);
