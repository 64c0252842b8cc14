//! The CPU implementation of every blueprint, computing exactly what the emitted PTX computes.
//!
//! Buffers are read and written as little-endian 32-bit values at byte offsets of guest memory.
//! Only the indices the launch grid covers are computed; every other output byte is left as it
//! was. The per-element order of operations is the GPU's (see each function), so f32 results
//! are bit-identical except for the payload of NaNs, which the hardware canonicalises.

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use crate::contract::{conv2d_output_size, BLOCK_1D};
use crate::{Blueprint, BlueprintKind, Dtype, ElementwiseOp, JitError, ReduceOp, Shape};

/// A 32-bit element type with the GPU's arithmetic.
pub(crate) trait Element: Copy + PartialOrd {
    const ZERO: Self;
    /// Identity of `max`: -inf or `i32::MIN`.
    const LOWEST: Self;
    fn from_le(bytes: [u8; 4]) -> Self;
    fn to_le(self) -> [u8; 4];
    fn from_arg(arg: &KernelArg) -> Option<Self>;
    fn add(self, other: Self) -> Self;
    fn sub(self, other: Self) -> Self;
    fn mul(self, other: Self) -> Self;
    /// `self * b + c`, fused for f32.
    fn fma(self, b: Self, c: Self) -> Self;
    /// `self / other`; `None` where the GPU has no defined result (integers).
    fn div(self, other: Self) -> Option<Self>;
}

impl Element for f32 {
    const ZERO: Self = 0.0;
    const LOWEST: Self = f32::NEG_INFINITY;
    fn from_le(bytes: [u8; 4]) -> Self {
        f32::from_le_bytes(bytes)
    }
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_arg(arg: &KernelArg) -> Option<Self> {
        match arg {
            KernelArg::F32(value) => Some(*value),
            _ => None,
        }
    }
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn sub(self, other: Self) -> Self {
        self - other
    }
    fn mul(self, other: Self) -> Self {
        self * other
    }
    fn fma(self, b: Self, c: Self) -> Self {
        self.mul_add(b, c)
    }
    fn div(self, other: Self) -> Option<Self> {
        Some(self / other)
    }
}

impl Element for i32 {
    const ZERO: Self = 0;
    const LOWEST: Self = i32::MIN;
    fn from_le(bytes: [u8; 4]) -> Self {
        i32::from_le_bytes(bytes)
    }
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_arg(arg: &KernelArg) -> Option<Self> {
        match arg {
            KernelArg::I32(value) => Some(*value),
            _ => None,
        }
    }
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    fn sub(self, other: Self) -> Self {
        self.wrapping_sub(other)
    }
    fn mul(self, other: Self) -> Self {
        self.wrapping_mul(other)
    }
    fn fma(self, b: Self, c: Self) -> Self {
        self.wrapping_mul(b).wrapping_add(c)
    }
    fn div(self, _other: Self) -> Option<Self> {
        None
    }
}

/// `a > b ? a : b`, the GPU's `setp.gt` + `selp`.
fn max<T: Element>(a: T, b: T) -> T {
    if a > b {
        a
    } else {
        b
    }
}

/// `a < b ? a : b`.
fn min<T: Element>(a: T, b: T) -> T {
    if a < b {
        a
    } else {
        b
    }
}

/// `count` elements starting at byte `offset`.
fn read<T: Element>(memory: &[u8], offset: usize, count: usize) -> Vec<T> {
    memory[offset..offset + 4 * count]
        .chunks_exact(4)
        .map(|chunk| T::from_le([chunk[0], chunk[1], chunk[2], chunk[3]]))
        .collect()
}

/// Writes `values` as elements `first..` of the buffer at byte `offset`.
fn write<T: Element>(memory: &mut [u8], offset: usize, first: usize, values: &[T]) {
    let start = offset + 4 * first;
    let bytes = &mut memory[start..start + 4 * values.len()];
    for (chunk, value) in bytes.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&value.to_le());
    }
}

/// Elements a one-dimensional launch covers: `min(n, grid.x * 256 * per_thread)`.
fn covered(config: &LaunchConfig, per_thread: u64, n: u64) -> usize {
    let threads = u64::from(config.grid[0]) * u64::from(BLOCK_1D);
    threads.saturating_mul(per_thread).min(n) as usize
}

impl Blueprint {
    /// Runs the kernel on the CPU over guest `memory`, after [`Blueprint::validate_launch`].
    ///
    /// Exactness per blueprint (f32 results are bit-identical to the GPU's except NaN payloads):
    /// - element-wise and vector_add: one IEEE operation per element (`fma` fused, everything
    ///   else separately rounded), i32 wrapping;
    /// - reduce: the GPU algorithm — in each row, thread `t` of 256 folds elements
    ///   `t, t+256, t+512, ...` in order into its partial; then partials are combined by a fixed
    ///   tree (`p[t] = op(p[t], p[t+s])` for `s = 128, 64, ..., 1`);
    /// - matmul: `c[i][j] = ((0 + a[i][0]·b[0][j]) + a[i][1]·b[1][j]) + ...` in order of `p`,
    ///   each product and sum rounded separately (tiling does not change the order);
    /// - conv2d: the same accumulation over channels `c`, then filter rows `r`, then columns
    ///   `s`; taps that fall in the zero padding are skipped, not added as zero products.
    ///
    /// # Errors
    /// Whatever `validate_launch` reports; nothing is written then.
    pub fn run_cpu(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), JitError> {
        self.validate_launch(config, args, memory.len())?;
        let shape = self.launch_shape(args)?;
        match self.dtype() {
            Dtype::F32 => self.run_typed::<f32>(config, args, &shape, memory),
            Dtype::I32 => self.run_typed::<i32>(config, args, &shape, memory),
        }
    }

    fn run_typed<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        memory: &mut [u8],
    ) -> Result<(), JitError> {
        // Validation checked every offset against the memory length, so they fit in usize.
        let buffers: Vec<usize> = args
            .iter()
            .filter_map(|arg| match arg {
                KernelArg::Buffer { offset, .. } => Some(*offset as usize),
                _ => None,
            })
            .collect();
        match (*self.kind(), *shape) {
            (BlueprintKind::Elementwise(op), Shape::Elements { n }) => {
                let count = covered(config, 1, u64::from(n));
                let alpha = args.iter().find_map(T::from_arg);
                elementwise::<T>(op, alpha, &buffers, count, memory)
            }
            (BlueprintKind::VectorAdd { lanes }, Shape::Elements { n }) => {
                let count = covered(config, u64::from(lanes), u64::from(n));
                elementwise::<T>(ElementwiseOp::Add, None, &buffers, count, memory)
            }
            (BlueprintKind::Reduce(op), Shape::Rows { rows, cols }) => {
                let rows = (rows.min(config.grid[0])) as usize;
                reduce::<T>(op, &buffers, rows, cols as usize, memory);
                Ok(())
            }
            (BlueprintKind::Matmul(tile), Shape::Matmul { m, n, k }) => {
                let rows = (u64::from(config.grid[1]) * u64::from(tile.m)).min(u64::from(m));
                let cols = (u64::from(config.grid[0]) * u64::from(tile.n)).min(u64::from(n));
                let dims = [m as usize, n as usize, k as usize];
                matmul::<T>(&buffers, dims, rows as usize, cols as usize, memory);
                Ok(())
            }
            (BlueprintKind::Conv2d(params), Shape::Conv2d { n, c, h, w, k }) => {
                let (p, q) = conv2d_output_size(&params, h, w);
                let conv = Conv {
                    n: n as usize,
                    c: c as usize,
                    h: h as usize,
                    w: w as usize,
                    k: k as usize,
                    r: params.r as usize,
                    s: params.s as usize,
                    stride: params.stride as usize,
                    pad: params.pad as usize,
                    p: p as usize,
                    q: q as usize,
                };
                let pixels = covered(config, 1, p * q);
                let channels = conv.k.min(config.grid[1] as usize);
                let images = conv.n.min(config.grid[2] as usize);
                conv2d::<T>(&conv, &buffers, [pixels, channels, images], memory);
                Ok(())
            }
            _ => Err(JitError::InvalidLaunch(format!(
                "{self} does not take a shape like {shape:?}"
            ))),
        }
    }
}

/// Element-wise over the first `count` elements: buffers are the inputs then the output.
fn elementwise<T: Element>(
    op: ElementwiseOp,
    alpha: Option<T>,
    buffers: &[usize],
    count: usize,
    memory: &mut [u8],
) -> Result<(), JitError> {
    let Some((&out, inputs)) = buffers.split_last() else {
        return Err(JitError::InvalidLaunch(
            "element-wise kernel without buffers".into(),
        ));
    };
    let inputs: Vec<Vec<T>> = inputs
        .iter()
        .map(|&offset| read::<T>(memory, offset, count))
        .collect();
    let result: Vec<T> = match (op, &inputs[..]) {
        (ElementwiseOp::Relu, [x]) => x.iter().map(|&x| max(x, T::ZERO)).collect(),
        (ElementwiseOp::Scale, [x]) => {
            let Some(alpha) = alpha else {
                return Err(JitError::InvalidLaunch("scale without alpha".into()));
            };
            x.iter().map(|&x| alpha.mul(x)).collect()
        }
        (ElementwiseOp::Fma, [a, b, c]) => a
            .iter()
            .zip(b)
            .zip(c)
            .map(|((&a, &b), &c)| a.fma(b, c))
            .collect(),
        (ElementwiseOp::Div, [a, b]) => {
            let quotients: Option<Vec<T>> = a.iter().zip(b).map(|(&a, &b)| a.div(b)).collect();
            quotients.ok_or_else(|| {
                JitError::InvalidBlueprint("division is only defined for f32".into())
            })?
        }
        (_, [a, b]) => {
            let combine: fn(T, T) -> T = match op {
                ElementwiseOp::Add => T::add,
                ElementwiseOp::Sub => T::sub,
                ElementwiseOp::Mul => T::mul,
                ElementwiseOp::Max => max,
                _ => min,
            };
            a.iter().zip(b).map(|(&a, &b)| combine(a, b)).collect()
        }
        _ => {
            return Err(JitError::InvalidLaunch(format!(
                "elementwise[{}] got {} input buffers",
                op.as_str(),
                inputs.len()
            )))
        }
    };
    write(memory, out, 0, &result);
    Ok(())
}

/// Threads per reduction block; the tree below assumes this power of two.
const REDUCE_THREADS: usize = BLOCK_1D as usize;

/// Reduces the first `rows` rows of `x` into `out`, with the GPU's strided-then-tree order.
fn reduce<T: Element>(
    op: ReduceOp,
    buffers: &[usize],
    rows: usize,
    cols: usize,
    memory: &mut [u8],
) {
    let [x, out] = buffers[..] else {
        return;
    };
    let (identity, combine): (T, fn(T, T) -> T) = match op {
        ReduceOp::Sum => (T::ZERO, T::add),
        ReduceOp::Max => (T::LOWEST, |acc, x| if x > acc { x } else { acc }),
    };
    let mut results = Vec::with_capacity(rows);
    let mut partials = [identity; REDUCE_THREADS];
    for row in 0..rows {
        let values = read::<T>(memory, x + 4 * row * cols, cols);
        partials.fill(identity);
        for (index, &value) in values.iter().enumerate() {
            let partial = &mut partials[index % REDUCE_THREADS];
            *partial = combine(*partial, value);
        }
        let mut stride = REDUCE_THREADS / 2;
        while stride > 0 {
            for t in 0..stride {
                partials[t] = combine(partials[t], partials[t + stride]);
            }
            stride /= 2;
        }
        results.push(partials[0]);
    }
    write(memory, out, 0, &results);
}

/// `c = a · b` for rows `0..rows` and columns `0..cols` of c; `dims` = `[m, n, k]`.
fn matmul<T: Element>(
    buffers: &[usize],
    [_m, n, k]: [usize; 3],
    rows: usize,
    cols: usize,
    memory: &mut [u8],
) {
    let [a, b, c] = buffers[..] else {
        return;
    };
    let a = read::<T>(memory, a, rows * k);
    let b = read::<T>(memory, b, k * n);
    let mut acc = vec![T::ZERO; cols];
    for i in 0..rows {
        acc.fill(T::ZERO);
        // i-p-j order: for each output element the products still arrive in order of p.
        for p in 0..k {
            let a_ip = a[i * k + p];
            let b_row = &b[p * n..p * n + cols];
            for (sum, &b_pj) in acc.iter_mut().zip(b_row) {
                *sum = sum.add(a_ip.mul(b_pj));
            }
        }
        write(memory, c, i * n, &acc);
    }
}

/// Dimensions of one convolution launch.
struct Conv {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: usize,
    r: usize,
    s: usize,
    stride: usize,
    pad: usize,
    p: usize,
    q: usize,
}

/// Output pixels `0..pixels` of channels `0..channels` of images `0..images`.
fn conv2d<T: Element>(
    conv: &Conv,
    buffers: &[usize],
    [pixels, channels, images]: [usize; 3],
    memory: &mut [u8],
) {
    let [input, weight, output] = buffers[..] else {
        return;
    };
    let image_len = conv.c * conv.h * conv.w;
    let filter_len = conv.c * conv.r * conv.s;
    let input = read::<T>(memory, input, conv.n.min(images) * image_len);
    let weight = read::<T>(memory, weight, conv.k.min(channels) * filter_len);
    let mut out = vec![T::ZERO; pixels];
    for img in 0..images {
        let image = &input[img * image_len..(img + 1) * image_len];
        for ko in 0..channels {
            let filter = &weight[ko * filter_len..(ko + 1) * filter_len];
            for (pq, result) in out.iter_mut().enumerate() {
                let (p, q) = (pq / conv.q, pq % conv.q);
                let mut acc = T::ZERO;
                for ci in 0..conv.c {
                    for r in 0..conv.r {
                        let Some(ih) = (p * conv.stride + r).checked_sub(conv.pad) else {
                            continue;
                        };
                        if ih >= conv.h {
                            continue;
                        }
                        let row = &image[(ci * conv.h + ih) * conv.w..][..conv.w];
                        let taps = &filter[(ci * conv.r + r) * conv.s..][..conv.s];
                        for (s, &tap) in taps.iter().enumerate() {
                            let Some(iw) = (q * conv.stride + s).checked_sub(conv.pad) else {
                                continue;
                            };
                            if iw < conv.w {
                                acc = acc.add(row[iw].mul(tap));
                            }
                        }
                    }
                }
                *result = acc;
            }
            write(memory, output, (img * conv.k + ko) * conv.p * conv.q, &out);
        }
    }
}
