//! The `wasi:cuda` guest ABI: constants, and validation of what guests pass.
//!
//! Guests import these functions from module `wasi:cuda` (all parameters and
//! results are `i32`; a negative result is an error code, and
//! `last_error(buf, len)` copies the message of the last failure):
//!
//! | import | signature | does |
//! |---|---|---|
//! | `kernel_from_blueprint` | `(desc_ptr, desc_len) -> handle` | a built-in kernel (`vector_add`, `scale`, `matmul`) or a JIT blueprint (`vector_add[4]:f32`, `elementwise[relu]`, `reduce[sum]:i32`, `matmul[16x16x16]`, `conv2d[3x3,s1,p1]`, ...; grammar and launch contracts in `tensor-wasm-jit`) |
//! | `kernel_from_ptx` | `(ptx_ptr, ptx_len, entry_ptr, entry_len) -> handle` | tenant PTX: verified and fenced (confined to the instance's memory, cancelled at the deadline) unless the function holds `raw_ptx`; the CPU backend runs tenant PTX in its PTX interpreter; refused PTX returns `INVALID_ARGUMENT` with the verifier's reason |
//! | `kernel_from_cuda` | `(src_ptr, src_len, entry_ptr, entry_len) -> handle` | tenant CUDA C++ (`extern "C" __global__` entry), compiled by NVRTC and cached, then loaded as `kernel_from_ptx` loads PTX (with `raw_ptx` on a CUDA device: as a cubin for its architecture); a compile error returns `INVALID_ARGUMENT` with NVRTC's log in `last_error` |
//! | `launch` | `(handle, gx, gy, gz, bx, by, bz, shared_bytes, args_ptr, args_len) -> status` | runs the kernel and returns when it has completed |
//! | `sync` | `() -> status` | barrier; always 0, since `launch` already waited |
//! | `last_error` | `(buf_ptr, buf_len) -> len` | copies the last error message, returns its full length |
//!
//! Kernel arguments are an array of 16-byte little-endian records at
//! `args_ptr` (any alignment): `u32 tag`, `u32 aux`, `u64 value`. Scalars put
//! their bits in `value` (32-bit types in the low half, the high half zero)
//! and `aux = 0`; a buffer (tag 7) is `value = guest offset`, `aux = length in
//! bytes`. Every buffer is checked against the instance's memory before
//! anything reaches a device, and again by the backend against the memory it
//! is handed. A kernel can never still be running when the guest resumes:
//! `launch` blocks until completion.

use tensor_wasm_gpu::KernelArg;

/// Import module name.
pub const MODULE: &str = "wasi:cuda";

/// Size of one argument record.
pub const RECORD_BYTES: u32 = 16;
/// Most arguments one launch may take.
pub const MAX_ARGS: u32 = 32;
/// Most kernel handles one instance may create.
pub const MAX_KERNELS_PER_INSTANCE: usize = 64;
/// Largest descriptor, PTX or source text a guest may pass.
pub const MAX_TEXT_BYTES: u32 = 4 << 20;

/// Error codes returned to guests (negative).
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// An argument is malformed or out of bounds.
    pub const INVALID_ARGUMENT: i32 = -1;
    /// The capability does not exist on this host or is not built yet.
    pub const NOT_AVAILABLE: i32 = -2;
    /// The function was not granted this capability.
    pub const PERMISSION_DENIED: i32 = -3;
    /// The kernel handle does not exist.
    pub const BAD_HANDLE: i32 = -4;
    /// A per-instance limit (kernels, arguments, text size) was reached.
    pub const LIMIT_EXCEEDED: i32 = -5;
    /// The device failed the launch.
    pub const DEVICE_ERROR: i32 = -6;
    /// The client of a streaming invocation disconnected (`tw:stream`).
    pub const CLIENT_GONE: i32 = -7;
}

/// Argument record tags.
pub mod tag {
    pub const I32: u32 = 1;
    pub const U32: u32 = 2;
    pub const I64: u32 = 3;
    pub const U64: u32 = 4;
    pub const F32: u32 = 5;
    pub const F64: u32 = 6;
    pub const BUFFER: u32 = 7;
}

/// Why guest input was refused; the message reaches the guest via `last_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AbiError {
    /// The (negative) code returned to the guest.
    pub code: i32,
    pub message: String,
}

impl AbiError {
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Self {
        AbiError {
            code,
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        AbiError::new(code::INVALID_ARGUMENT, message)
    }
}

/// The bytes `[ptr, ptr + len)` of guest memory, if they are all inside it.
pub fn guest_bytes(memory: &[u8], ptr: i32, len: i32) -> Result<&[u8], AbiError> {
    let (start, len) = (ptr as u32 as usize, len as u32 as usize);
    start
        .checked_add(len)
        .filter(|&end| end <= memory.len())
        .map(|end| &memory[start..end])
        .ok_or_else(|| {
            AbiError::invalid(format!(
                "range {start}+{len} is outside guest memory of {} bytes",
                memory.len()
            ))
        })
}

/// UTF-8 text at `[ptr, ptr + len)`, bounded by [`MAX_TEXT_BYTES`].
pub fn guest_str(memory: &[u8], ptr: i32, len: i32, what: &str) -> Result<String, AbiError> {
    if len as u32 > MAX_TEXT_BYTES {
        return Err(AbiError::new(
            code::LIMIT_EXCEEDED,
            format!(
                "{what} is {} bytes; the limit is {MAX_TEXT_BYTES}",
                len as u32
            ),
        ));
    }
    let bytes = guest_bytes(memory, ptr, len)?;
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|e| AbiError::invalid(format!("{what} is not UTF-8: {e}")))
}

/// Decodes and checks the argument records at `[args_ptr, args_ptr + args_len)`.
///
/// Never panics; never returns a buffer that is not entirely inside `memory`.
pub fn parse_args(memory: &[u8], args_ptr: i32, args_len: i32) -> Result<Vec<KernelArg>, AbiError> {
    let len = args_len as u32;
    if !len.is_multiple_of(RECORD_BYTES) {
        return Err(AbiError::invalid(format!(
            "args_len {len} is not a multiple of {RECORD_BYTES}"
        )));
    }
    if len / RECORD_BYTES > MAX_ARGS {
        return Err(AbiError::new(
            code::LIMIT_EXCEEDED,
            format!("{} arguments; the limit is {MAX_ARGS}", len / RECORD_BYTES),
        ));
    }
    let bytes = guest_bytes(memory, args_ptr, args_len)?;
    bytes
        .chunks_exact(RECORD_BYTES as usize)
        .enumerate()
        .map(|(i, record)| parse_record(i, record, memory.len() as u64))
        .collect()
}

fn parse_record(i: usize, record: &[u8], memory_len: u64) -> Result<KernelArg, AbiError> {
    let tag = u32::from_le_bytes(record[0..4].try_into().expect("4 bytes"));
    let aux = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes"));
    let value = u64::from_le_bytes(record[8..16].try_into().expect("8 bytes"));
    let narrow = || -> Result<u32, AbiError> {
        u32::try_from(value).map_err(|_| {
            AbiError::invalid(format!("argument {i}: 32-bit value with high bits set"))
        })
    };
    if tag != tag::BUFFER && aux != 0 {
        return Err(AbiError::invalid(format!(
            "argument {i}: aux must be 0 for scalars"
        )));
    }
    Ok(match tag {
        tag::I32 => KernelArg::I32(narrow()? as i32),
        tag::U32 => KernelArg::U32(narrow()?),
        tag::I64 => KernelArg::I64(value as i64),
        tag::U64 => KernelArg::U64(value),
        tag::F32 => KernelArg::F32(f32::from_bits(narrow()?)),
        tag::F64 => KernelArg::F64(f64::from_bits(value)),
        tag::BUFFER => {
            let len = u64::from(aux);
            let inside = value.checked_add(len).is_some_and(|end| end <= memory_len);
            if !inside {
                return Err(AbiError::invalid(format!(
                    "argument {i}: buffer {value}+{len} is outside guest memory of {memory_len} \
                     bytes"
                )));
            }
            KernelArg::Buffer { offset: value, len }
        }
        other => {
            return Err(AbiError::invalid(format!(
                "argument {i}: unknown tag {other}"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(tag: u32, aux: u32, value: u64) -> Vec<u8> {
        let mut r = Vec::with_capacity(16);
        r.extend_from_slice(&tag.to_le_bytes());
        r.extend_from_slice(&aux.to_le_bytes());
        r.extend_from_slice(&value.to_le_bytes());
        r
    }

    fn memory_with(records: &[Vec<u8>], at: usize, size: usize) -> Vec<u8> {
        let mut memory = vec![0u8; size];
        let flat: Vec<u8> = records.concat();
        memory[at..at + flat.len()].copy_from_slice(&flat);
        memory
    }

    #[test]
    fn decodes_every_tag() {
        let records = vec![
            record(tag::I32, 0, (-5i32) as u32 as u64),
            record(tag::U32, 0, 7),
            record(tag::I64, 0, (-9i64) as u64),
            record(tag::U64, 0, u64::MAX),
            record(tag::F32, 0, u64::from(1.5f32.to_bits())),
            record(tag::F64, 0, 2.5f64.to_bits()),
            record(tag::BUFFER, 64, 1024),
        ];
        let memory = memory_with(&records, 3, 4096); // misaligned records are fine
        let args = parse_args(&memory, 3, 7 * 16).unwrap();
        assert_eq!(
            args,
            vec![
                KernelArg::I32(-5),
                KernelArg::U32(7),
                KernelArg::I64(-9),
                KernelArg::U64(u64::MAX),
                KernelArg::F32(1.5),
                KernelArg::F64(2.5),
                KernelArg::Buffer {
                    offset: 1024,
                    len: 64
                },
            ]
        );
    }

    #[test]
    fn zero_length_buffer_at_the_end_is_inside() {
        let memory = memory_with(&[record(tag::BUFFER, 0, 4096)], 0, 4096);
        assert_eq!(
            parse_args(&memory, 0, 16).unwrap(),
            vec![KernelArg::Buffer {
                offset: 4096,
                len: 0
            }]
        );
        let memory = memory_with(&[record(tag::BUFFER, 1, 4096)], 0, 4096);
        assert!(parse_args(&memory, 0, 16).is_err());
    }

    #[test]
    fn refuses_malformed_records() {
        let cases = [
            (record(tag::BUFFER, 16, u64::MAX - 8), "wrapping buffer"),
            (record(tag::BUFFER, 4097, 0), "longer than memory"),
            (record(tag::U32, 0, 1 << 32), "high bits of a 32-bit value"),
            (record(tag::I32, 1, 0), "aux on a scalar"),
            (record(99, 0, 0), "unknown tag"),
        ];
        for (r, what) in cases {
            let memory = memory_with(&[r], 0, 4096);
            let err = parse_args(&memory, 0, 16).unwrap_err();
            assert_eq!(err.code, code::INVALID_ARGUMENT, "{what}");
        }
        let memory = vec![0u8; 4096];
        assert_eq!(
            parse_args(&memory, 0, 15).unwrap_err().code,
            code::INVALID_ARGUMENT
        );
        assert_eq!(
            parse_args(&memory, 0, 33 * 16).unwrap_err().code,
            code::LIMIT_EXCEEDED
        );
        assert_eq!(
            parse_args(&memory, 4090, 16).unwrap_err().code,
            code::INVALID_ARGUMENT
        );
        assert_eq!(
            parse_args(&memory, -16, 16).unwrap_err().code,
            code::INVALID_ARGUMENT
        );
    }

    #[test]
    fn text_is_bounded_and_utf8() {
        let mut memory = vec![0u8; 64];
        memory[..10].copy_from_slice(b"vector_add");
        assert_eq!(
            guest_str(&memory, 0, 10, "descriptor").unwrap(),
            "vector_add"
        );
        memory[0] = 0xff;
        assert!(guest_str(&memory, 0, 10, "descriptor").is_err());
        assert_eq!(
            guest_str(&memory, 0, -1, "descriptor").unwrap_err().code,
            code::LIMIT_EXCEEDED
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Arbitrary bytes, pointers and lengths: never a panic, and every
        /// accepted buffer lies inside memory.
        #[test]
        fn accepted_buffers_are_always_inside_memory(
            memory_len in 0usize..2048,
            fill in proptest::collection::vec(any::<u8>(), 0..2048),
            args_ptr in any::<i32>(),
            args_len in any::<i32>(),
        ) {
            let mut memory = vec![0u8; memory_len];
            for (m, f) in memory.iter_mut().zip(fill) { *m = f; }
            if let Ok(args) = parse_args(&memory, args_ptr, args_len) {
                for arg in args {
                    if let KernelArg::Buffer { offset, len } = arg {
                        prop_assert!(offset.checked_add(len).unwrap() <= memory.len() as u64);
                    }
                }
            }
        }

        /// Well-formed buffer records near the edges: accepted exactly when inside.
        #[test]
        fn buffer_records_are_accepted_iff_inside(
            offset in prop_oneof![0u64..5000, (u64::MAX - 5000)..=u64::MAX, Just(u64::from(u32::MAX))],
            len in prop_oneof![0u32..5000, (u32::MAX - 10)..=u32::MAX],
            records_at in 0usize..64,
        ) {
            let memory = memory_with(&[record(tag::BUFFER, len, offset)], records_at, 4096);
            let inside = offset.checked_add(u64::from(len)).is_some_and(|e| e <= 4096);
            prop_assert_eq!(parse_args(&memory, records_at as i32, 16).is_ok(), inside);
        }

        /// Many records: more than MAX_ARGS is always refused.
        #[test]
        fn too_many_records_are_refused(n in 0u32..100) {
            let memory = vec![0u8; 4096];
            let result = parse_args(&memory, 0, (n * RECORD_BYTES) as i32);
            if n > MAX_ARGS {
                prop_assert_eq!(result.unwrap_err().code, code::LIMIT_EXCEEDED);
            }
        }
    }
}
