//! Launch validation shared by every backend: launch limits, buffer bounds, builtin signatures.
//!
//! Everything here is plain arithmetic on the arguments; it never touches guest memory, and it
//! rejects bad input with `GpuError::InvalidArgument` instead of panicking.

use std::ops::Range;

use crate::{BuiltinKernel, GpuError, KernelArg, LaunchConfig};

/// At most this many threads in one block (every CUDA device of compute capability 2.0 and up).
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;
/// Largest `grid.x` (2^31 - 1).
pub const MAX_GRID_X: u32 = i32::MAX as u32;
/// Largest `grid.y` and `grid.z`.
pub const MAX_GRID_YZ: u32 = 65_535;
/// Largest `block.z`.
pub const MAX_BLOCK_Z: u32 = 64;
/// Most dynamic shared memory a launch may ask for (48 KiB, the limit without opt-in).
pub const MAX_SHARED_BYTES: u32 = 48 * 1024;

const F32_BYTES: u64 = 4;

/// Checks `config` against the CUDA launch limits.
pub(crate) fn check_config(config: &LaunchConfig) -> Result<(), GpuError> {
    for (axis, (&grid, &block)) in ["x", "y", "z"]
        .iter()
        .zip(config.grid.iter().zip(config.block.iter()))
    {
        if grid == 0 {
            return Err(invalid(format!(
                "launch config: grid.{axis} is 0; every grid dimension must be at least 1"
            )));
        }
        if block == 0 {
            return Err(invalid(format!(
                "launch config: block.{axis} is 0; every block dimension must be at least 1"
            )));
        }
    }
    if config.grid[0] > MAX_GRID_X {
        return Err(invalid(format!(
            "launch config: grid.x = {} exceeds the CUDA limit {MAX_GRID_X}",
            config.grid[0]
        )));
    }
    for (axis, &grid) in [("y", &config.grid[1]), ("z", &config.grid[2])] {
        if grid > MAX_GRID_YZ {
            return Err(invalid(format!(
                "launch config: grid.{axis} = {grid} exceeds the CUDA limit {MAX_GRID_YZ}"
            )));
        }
    }
    // Saturating: three u32 dimensions can exceed u64.
    let threads = config
        .block
        .iter()
        .fold(1u64, |threads, &d| threads.saturating_mul(u64::from(d)));
    if threads > MAX_THREADS_PER_BLOCK {
        let [x, y, z] = config.block;
        return Err(invalid(format!(
            "launch config: block of {x} x {y} x {z} = {threads} threads exceeds the limit of \
             {MAX_THREADS_PER_BLOCK} threads per block"
        )));
    }
    if config.block[2] > MAX_BLOCK_Z {
        return Err(invalid(format!(
            "launch config: block.z = {} exceeds the CUDA limit {MAX_BLOCK_Z}",
            config.block[2]
        )));
    }
    if config.shared_bytes > MAX_SHARED_BYTES {
        return Err(invalid(format!(
            "launch config: shared_bytes = {} exceeds the limit of {MAX_SHARED_BYTES} bytes (48 KiB)",
            config.shared_bytes
        )));
    }
    Ok(())
}

/// Checks that `offset..offset + len` lies inside a memory of `memory_len` bytes and returns the
/// range as `usize`. Overflow-safe for any `offset` and `len`.
pub(crate) fn check_buffer(
    label: &str,
    offset: u64,
    len: u64,
    memory_len: usize,
) -> Result<Range<usize>, GpuError> {
    let memory_len_u64 = memory_len as u64;
    let Some(end) = offset.checked_add(len) else {
        return Err(invalid(format!(
            "{label}: buffer offset {offset} + len {len} overflows"
        )));
    };
    if end > memory_len_u64 {
        return Err(invalid(format!(
            "{label}: buffer [{offset}, {end}) ends beyond guest memory of {memory_len} bytes"
        )));
    }
    // Both fit: they are at most `memory_len`, a usize.
    let (Ok(start), Ok(end)) = (usize::try_from(offset), usize::try_from(end)) else {
        return Err(invalid(format!(
            "{label}: buffer [{offset}, {end}) is not addressable on this host"
        )));
    };
    Ok(start..end)
}

/// Checks every buffer argument of a kernel whose signature this crate does not know (tenant
/// PTX): each must lie inside guest memory.
pub(crate) fn check_buffers(
    kernel: &str,
    args: &[KernelArg],
    memory_len: usize,
) -> Result<(), GpuError> {
    for (index, arg) in args.iter().enumerate() {
        if let KernelArg::Buffer { offset, len } = *arg {
            // The label is only written out for an error (a launch checks every argument).
            if check_buffer("", offset, len, memory_len).is_err() {
                check_buffer(
                    &format!("{kernel} argument {index}"),
                    offset,
                    len,
                    memory_len,
                )?;
            }
        }
    }
    Ok(())
}

/// A builtin launch whose arguments passed validation. Buffers are byte offsets into guest
/// memory, each followed by at least as many f32 values as the kernel may touch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum BuiltinCall {
    VectorAdd {
        a: usize,
        b: usize,
        out: usize,
        n: u32,
    },
    Scale {
        x: usize,
        out: usize,
        alpha: f32,
        n: u32,
    },
    Matmul {
        a: usize,
        b: usize,
        c: usize,
        m: u32,
        n: u32,
        k: u32,
    },
}

impl BuiltinCall {
    /// The byte ranges the kernel reads and the one it writes, for an aliasing check.
    pub(crate) fn spans(&self) -> (Vec<Range<usize>>, Range<usize>) {
        let f32s = |offset: usize, count: u64| offset..offset + (count * F32_BYTES) as usize;
        match *self {
            BuiltinCall::VectorAdd { a, b, out, n } => {
                let n = u64::from(n);
                (vec![f32s(a, n), f32s(b, n)], f32s(out, n))
            }
            BuiltinCall::Scale { x, out, n, .. } => {
                let n = u64::from(n);
                (vec![f32s(x, n)], f32s(out, n))
            }
            BuiltinCall::Matmul { a, b, c, m, n, k } => {
                let (m, n, k) = (u64::from(m), u64::from(n), u64::from(k));
                (vec![f32s(a, m * k), f32s(b, k * n)], f32s(c, m * n))
            }
        }
    }

    /// Whether the written range overlaps any range the kernel reads.
    pub(crate) fn output_aliases_input(&self) -> bool {
        let (inputs, output) = self.spans();
        !output.is_empty()
            && inputs.iter().any(|input| {
                !input.is_empty() && input.start < output.end && output.start < input.end
            })
    }
}

/// A buffer argument that passed the bounds and alignment checks.
struct CheckedBuffer {
    label: String,
    range: Range<usize>,
}

impl CheckedBuffer {
    /// Checks that the buffer holds `count` f32 values (`None`: the count overflowed); `what`
    /// explains the count. Returns the buffer's offset.
    fn require_f32s(&self, count: Option<u64>, what: &str) -> Result<usize, GpuError> {
        let bytes = count.and_then(|count| count.checked_mul(F32_BYTES));
        let len = self.range.len() as u64;
        match bytes {
            Some(bytes) if bytes <= len => Ok(self.range.start),
            Some(bytes) => Err(invalid(format!(
                "{}: buffer of {len} bytes is too small for {what} f32 values ({bytes} bytes)",
                self.label
            ))),
            None => Err(invalid(format!(
                "{}: {what} f32 values are more than any buffer can hold",
                self.label
            ))),
        }
    }
}

/// Parameter names and types of each builtin, for messages.
fn signature(kernel: BuiltinKernel) -> &'static [(&'static str, &'static str)] {
    match kernel {
        BuiltinKernel::VectorAdd => &[
            ("a", "buffer"),
            ("b", "buffer"),
            ("out", "buffer"),
            ("n", "u32"),
        ],
        BuiltinKernel::Scale => &[
            ("x", "buffer"),
            ("out", "buffer"),
            ("alpha", "f32"),
            ("n", "u32"),
        ],
        BuiltinKernel::Matmul => &[
            ("a", "buffer"),
            ("b", "buffer"),
            ("c", "buffer"),
            ("m", "u32"),
            ("n", "u32"),
            ("k", "u32"),
        ],
    }
}

/// Reads builtin arguments one by one, naming each in errors.
struct ArgReader {
    kernel: BuiltinKernel,
    memory_len: usize,
}

impl ArgReader {
    fn label(&self, index: usize) -> String {
        let param = signature(self.kernel)
            .get(index)
            .map_or("?", |(param, _)| *param);
        format!("{} argument {index} `{param}`", self.kernel.descriptor())
    }

    fn wrong_type(&self, index: usize, expected: &str, got: &KernelArg) -> GpuError {
        invalid(format!(
            "{} must be {expected}, got {}",
            self.label(index),
            got.type_name()
        ))
    }

    fn f32_buffer(&self, index: usize, arg: &KernelArg) -> Result<CheckedBuffer, GpuError> {
        let label = self.label(index);
        let KernelArg::Buffer { offset, len } = *arg else {
            return Err(self.wrong_type(index, "buffer", arg));
        };
        let range = check_buffer(&label, offset, len, self.memory_len)?;
        if offset % F32_BYTES != 0 {
            return Err(invalid(format!(
                "{label}: buffer offset {offset} is not a multiple of 4 (f32 data must be 4-byte aligned)"
            )));
        }
        Ok(CheckedBuffer { label, range })
    }

    fn u32(&self, index: usize, arg: &KernelArg) -> Result<u32, GpuError> {
        match *arg {
            KernelArg::U32(v) => Ok(v),
            _ => Err(self.wrong_type(index, "u32", arg)),
        }
    }

    fn f32(&self, index: usize, arg: &KernelArg) -> Result<f32, GpuError> {
        match *arg {
            KernelArg::F32(v) => Ok(v),
            _ => Err(self.wrong_type(index, "f32", arg)),
        }
    }
}

/// Checks `args` against the signature of `kernel` and the size of guest memory.
pub(crate) fn plan_builtin(
    kernel: BuiltinKernel,
    args: &[KernelArg],
    memory_len: usize,
) -> Result<BuiltinCall, GpuError> {
    let reader = ArgReader { kernel, memory_len };
    match (kernel, args) {
        (BuiltinKernel::VectorAdd, [a, b, out, n]) => {
            let (a, b, out) = (
                reader.f32_buffer(0, a)?,
                reader.f32_buffer(1, b)?,
                reader.f32_buffer(2, out)?,
            );
            let n = reader.u32(3, n)?;
            let (count, what) = (Some(u64::from(n)), format!("n = {n}"));
            Ok(BuiltinCall::VectorAdd {
                a: a.require_f32s(count, &what)?,
                b: b.require_f32s(count, &what)?,
                out: out.require_f32s(count, &what)?,
                n,
            })
        }
        (BuiltinKernel::Scale, [x, out, alpha, n]) => {
            let (x, out) = (reader.f32_buffer(0, x)?, reader.f32_buffer(1, out)?);
            let alpha = reader.f32(2, alpha)?;
            let n = reader.u32(3, n)?;
            let (count, what) = (Some(u64::from(n)), format!("n = {n}"));
            Ok(BuiltinCall::Scale {
                x: x.require_f32s(count, &what)?,
                out: out.require_f32s(count, &what)?,
                alpha,
                n,
            })
        }
        (BuiltinKernel::Matmul, [a, b, c, m, n, k]) => {
            let (a, b, c) = (
                reader.f32_buffer(0, a)?,
                reader.f32_buffer(1, b)?,
                reader.f32_buffer(2, c)?,
            );
            let (m, n, k) = (reader.u32(3, m)?, reader.u32(4, n)?, reader.u32(5, k)?);
            let product = |x: u32, y: u32| u64::from(x).checked_mul(u64::from(y));
            Ok(BuiltinCall::Matmul {
                a: a.require_f32s(product(m, k), &format!("m * k = {m} * {k}"))?,
                b: b.require_f32s(product(k, n), &format!("k * n = {k} * {n}"))?,
                c: c.require_f32s(product(m, n), &format!("m * n = {m} * {n}"))?,
                m,
                n,
                k,
            })
        }
        (kernel, args) => {
            let params = signature(kernel);
            let expected = params
                .iter()
                .map(|(param, ty)| format!("{param}: {ty}"))
                .collect::<Vec<_>>()
                .join(", ");
            Err(invalid(format!(
                "{} expects {} arguments ({expected}), got {}",
                kernel.descriptor(),
                params.len(),
                args.len()
            )))
        }
    }
}

fn invalid(message: String) -> GpuError {
    GpuError::InvalidArgument(message)
}
