//! A deterministic generator of realistic memory images for tests and benchmarks
//! ([`realistic_image`]), and the zero-page test shared by the encoders.

/// Bytes per page of the image layout (and of the local encoding).
pub const IMAGE_PAGE: usize = 4096;

/// Builds a `len`-byte image that looks like a Wasm linear memory rather than a constant fill.
///
/// The image is a sequence of segments, each 1 to 32 pages of 4 KiB long (uniform), whose
/// kind is drawn independently:
///
/// - 35 %: **zero pages** (untouched heap, `.bss`, reserved space);
/// - 30 %: **ASCII text**: words from a fixed 48-word vocabulary separated by spaces,
///   punctuation and newlines (logs, JSON, strings) — compresses roughly 3-4x with zstd;
/// - 35 %: **random `f32`s** uniform in [-1, 1), little-endian (model weights, activations) —
///   close to incompressible.
///
/// The last segment is cut at `len`. Randomness is a xorshift64* stream seeded with `seed`
/// (zero is replaced by a fixed non-zero constant), so equal arguments give equal images.
#[must_use]
pub fn realistic_image(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 48] = [
        "tensor", "request", "tenant", "kernel", "memory", "error", "ok", "status", "latency",
        "shape", "float32", "batch", "model", "weights", "layer", "input", "output", "token",
        "cache", "hit", "miss", "function", "invoke", "wasm", "gpu", "stream", "queue", "id",
        "the", "of", "and", "to", "in", "is", "for", "with", "value", "null", "true", "false",
        "user", "time", "ms", "bytes", "page", "size", "count", "index",
    ];
    const PUNCT: [u8; 8] = [b' ', b' ', b' ', b',', b'.', b':', b'"', b'\n'];
    let mut rng = XorShift::new(seed);
    let mut out = vec![0u8; len];
    let mut pos = 0;
    while pos < len {
        let pages = 1 + (rng.next() % 32) as usize;
        let end = (pos + pages * IMAGE_PAGE).min(len);
        let kind = rng.next() % 100;
        let seg = &mut out[pos..end];
        if kind < 35 {
            // zero pages: already zero
        } else if kind < 65 {
            let mut i = 0;
            while i < seg.len() {
                let r = rng.next();
                let word = WORDS[(r % 48) as usize].as_bytes();
                let n = word.len().min(seg.len() - i);
                seg[i..i + n].copy_from_slice(&word[..n]);
                i += n;
                if i < seg.len() {
                    seg[i] = PUNCT[((r >> 32) % 8) as usize];
                    i += 1;
                }
            }
        } else {
            for four in seg.chunks_mut(4) {
                let v = (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                let bytes = v.to_le_bytes();
                four.copy_from_slice(&bytes[..four.len()]);
            }
        }
        pos = end;
    }
    out
}

struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Whether every byte of `bytes` is zero (vectorises; exits early on the first non-zero block).
pub(crate) fn is_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(256);
    for block in blocks.by_ref() {
        let acc = block.chunks_exact(16).fold(0u128, |acc, w| {
            acc | u128::from_ne_bytes(w.try_into().unwrap_or([1; 16]))
        });
        if acc != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_is_deterministic_and_mixed() {
        let a = realistic_image(8 << 20, 42);
        assert_eq!(a, realistic_image(8 << 20, 42));
        assert_ne!(a, realistic_image(8 << 20, 43));
        let pages = a.chunks(IMAGE_PAGE).count();
        let zero = a.chunks(IMAGE_PAGE).filter(|p| is_zero(p)).count();
        let text = a
            .chunks(IMAGE_PAGE)
            .filter(|p| !is_zero(p) && p.iter().all(u8::is_ascii))
            .count();
        // Each kind holds a substantial share of the pages.
        for share in [zero, text, pages - zero - text] {
            assert!(share * 10 > pages, "{zero} zero, {text} text of {pages}");
        }
    }

    #[test]
    fn odd_lengths_are_filled_exactly() {
        assert_eq!(realistic_image(12_345, 1).len(), 12_345);
        assert!(realistic_image(0, 1).is_empty());
    }

    #[test]
    fn is_zero_finds_any_set_byte() {
        let mut v = vec![0u8; 1000];
        assert!(is_zero(&v));
        for i in [0, 255, 256, 999] {
            v[i] = 1;
            assert!(!is_zero(&v));
            v[i] = 0;
        }
    }
}
