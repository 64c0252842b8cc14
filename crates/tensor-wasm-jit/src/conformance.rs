//! The conformance set: the one list of kernels whose results must be bit-identical on every
//! backend (every blueprint kind × dtype, the builtins, the CUDA C++ test kernels) and the
//! deterministic launches they are checked on.
//!
//! Three places use it and none keeps a list of its own: the PTX interpreter's conformance
//! run (`tensor-wasm-ptx-emu/tests/conformance`, random cases plus the fixed ones here), the
//! `ptxas` test of this crate, and the GPU suite (`gpu-suite bit-identity` runs the fixed
//! cases on a GPU and compares the memory with a record the CPU backend made at build time;
//! `correctness` and `http-check` launch [`blueprint_kinds`] through the runtime).
//!
//! A case is a whole guest memory: buffers at 64-byte-aligned offsets separated by gaps of
//! [`CANARY`] words, inputs filled with edge values (NaN, ±Inf, subnormals, full-range
//! integers). Comparing the whole memory after a launch also checks that nothing outside an
//! output was written.

use tensor_wasm_gpu::{BuiltinKernel, KernelArg, LaunchConfig};

use crate::kinds::{with_kind, Kind};
use crate::{Blueprint, Dtype, ParamKind};

/// Every blueprint kind with the parameter choices checked (each kind's examples, in catalogue
/// order), each in f32 and i32 where the kind is defined: [`blueprints`].
pub fn blueprint_kinds() -> Vec<&'static str> {
    crate::kinds::examples()
}

/// [`blueprint_kinds`] in f32, then in i32 (where defined).
pub fn blueprints() -> Vec<Blueprint> {
    let mut out = Vec::new();
    for dtype in ["f32", "i32"] {
        for kind in blueprint_kinds() {
            if let Ok(blueprint) = Blueprint::parse(&format!("{kind}:{dtype}")) {
                out.push(blueprint);
            }
        }
    }
    out
}

/// Bytes that no kernel may touch (gaps between buffers, unused tails of outputs).
pub const CANARY: u32 = 0x5ac3_5ac3;

/// splitmix64, for shapes and input values.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator seeded by `name` (FNV-1a), so a case depends on its name alone.
    pub fn named(name: &str) -> Self {
        Rng(name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        }))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// An f32's bits: special values, any bits, or ordinary values near 1 with full mantissas
    /// (where rounding differences show).
    pub fn f32_bits(&mut self) -> u32 {
        const SPECIAL: [u32; 14] = [
            0x0000_0000, // +0
            0x8000_0000, // -0
            0x3f80_0000, // 1
            0xbf80_0000, // -1
            0x7f80_0000, // +inf
            0xff80_0000, // -inf
            0x7fc0_0000, // NaN
            0x7fc0_0001, // NaN with a payload
            0xffc0_0000, // negative NaN
            0x0000_0001, // smallest subnormal
            0x807f_ffff, // largest negative subnormal
            0x0080_0000, // smallest normal
            0x7f7f_ffff, // largest finite
            0x3dcc_cccd, // 0.1
        ];
        match self.below(10) {
            0 => SPECIAL[self.below(SPECIAL.len() as u64) as usize],
            1 => self.next_u64() as u32,
            _ => {
                let sign = (self.next_u64() as u32 & 1) << 31;
                let exponent = 120 + self.below(15) as u32;
                sign | exponent << 23 | (self.next_u64() as u32 & 0x007f_ffff)
            }
        }
    }

    /// An i32's bits: edge values or anything.
    pub fn i32_bits(&mut self) -> u32 {
        const SPECIAL: [i32; 6] = [0, 1, -1, i32::MIN, i32::MAX, 2];
        match self.below(5) {
            0 => SPECIAL[self.below(SPECIAL.len() as u64) as usize] as u32,
            1 => self.below(7) as u32,
            _ => self.next_u64() as u32,
        }
    }

    /// A value of `dtype`'s bits.
    pub fn bits(&mut self, dtype: Dtype) -> u32 {
        match dtype {
            Dtype::F32 => self.f32_bits(),
            Dtype::I32 => self.i32_bits(),
        }
    }
}

/// Guest memory: each buffer at a 64-byte-aligned offset after a canary gap, the whole
/// memory filled with [`CANARY`] before inputs are written.
#[derive(Debug, Clone)]
pub struct Layout {
    pub memory: Vec<u8>,
    /// `(offset, len)` of each buffer, in parameter order.
    pub buffers: Vec<(usize, usize)>,
}

impl Layout {
    pub fn new(lens: &[usize]) -> Self {
        let mut offset = 64;
        let mut buffers = Vec::new();
        for &len in lens {
            buffers.push((offset, len));
            offset = (offset + len + 64).next_multiple_of(64);
        }
        let memory = CANARY.to_le_bytes().repeat(offset / 4);
        Layout { memory, buffers }
    }

    /// Fills the first `elements` of buffer `index` with values of `dtype`.
    pub fn fill(&mut self, index: usize, elements: usize, dtype: Dtype, rng: &mut Rng) {
        let words: Vec<u32> = (0..elements).map(|_| rng.bits(dtype)).collect();
        self.write(index, &words);
    }

    /// Writes `words` at the start of buffer `index`.
    pub fn write(&mut self, index: usize, words: &[u32]) {
        let (offset, len) = self.buffers[index];
        assert!(
            4 * words.len() <= len,
            "{} words in {len} bytes",
            words.len()
        );
        for (i, word) in words.iter().enumerate() {
            let at = offset + 4 * i;
            self.memory[at..at + 4].copy_from_slice(&word.to_le_bytes());
        }
    }

    /// The first `elements` words of buffer `index`.
    pub fn words(&self, index: usize, elements: usize) -> Vec<u32> {
        let (offset, _) = self.buffers[index];
        self.memory[offset..offset + 4 * elements]
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    }

    /// Buffer `index` as a kernel argument.
    pub fn arg(&self, index: usize) -> KernelArg {
        let (offset, len) = self.buffers[index];
        KernelArg::Buffer {
            offset: offset as u64,
            len: len as u64,
        }
    }
}

/// The first difference of two memories, word by word; for f32 data two NaNs are equal (the
/// hardware writes its own NaN). `None` when they are equal.
pub fn first_difference(dtype: Dtype, expected: &[u8], actual: &[u8]) -> Option<String> {
    if expected.len() != actual.len() {
        return Some(format!(
            "{} bytes expected, {} bytes read",
            expected.len(),
            actual.len()
        ));
    }
    let mut differing = 0usize;
    let mut first = None;
    for (i, (e, a)) in expected
        .chunks_exact(4)
        .zip(actual.chunks_exact(4))
        .enumerate()
    {
        let e = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        let a = u32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        let both_nan =
            dtype == Dtype::F32 && f32::from_bits(e).is_nan() && f32::from_bits(a).is_nan();
        if e != a && !both_nan {
            differing += 1;
            first.get_or_insert((i, e, a));
        }
    }
    first.map(|(i, e, a)| {
        let canary = if e == CANARY { " (a canary)" } else { "" };
        format!(
            "{differing} word(s) differ; first at byte {}: expected {e:#010x} ({}){canary}, \
             found {a:#010x} ({})",
            4 * i,
            f32::from_bits(e),
            f32::from_bits(a)
        )
    })
}

/// One blueprint case: five shape numbers, a grid change per axis, spare elements after each
/// buffer, and the seed of the input values.
#[derive(Debug, Clone)]
pub struct Case {
    pub dims: [u32; 5],
    pub grid_delta: [i32; 3],
    pub slack: usize,
    /// Element-wise and vector_add: write the output over the first input.
    pub in_place: bool,
    pub seed: u64,
}

impl Case {
    /// A case drawn from `rng`: each number small (0..4), near 256 (250..260) or anything below
    /// 700; each grid axis one block short to two blocks over.
    pub fn draw(rng: &mut Rng) -> Self {
        let mut dim = || match rng.below(3) {
            0 => rng.below(4) as u32,
            1 => 250 + rng.below(10) as u32,
            _ => rng.below(700) as u32,
        };
        let dims = [dim(), dim(), dim(), dim(), dim()];
        let grid_delta = [0; 3].map(|_: i32| rng.below(4) as i32 - 1);
        Case {
            dims,
            grid_delta,
            slack: rng.below(3) as usize,
            in_place: rng.below(2) == 1,
            seed: rng.next_u64(),
        }
    }
}

/// Fixed cases per blueprint: what the interpreter's run and the GPU suite both check.
pub const FIXED_CASES: usize = 8;

/// Fixed cases per builtin kernel.
pub const BUILTIN_FIXED_CASES: usize = 12;

/// The fixed cases of `blueprint`: `count` cases drawn from a generator named after it.
pub fn fixed_cases(blueprint: &Blueprint, count: usize) -> Vec<Case> {
    let mut rng = Rng::named(&blueprint.descriptor());
    (0..count).map(|_| Case::draw(&mut rng)).collect()
}

/// Random cases per blueprint of the interpreter's run: more for the cheap kinds.
pub fn random_case_count(blueprint: &Blueprint) -> u32 {
    blueprint.kind().random_cases()
}

/// The launch of `blueprint` for `case`: configuration, arguments and initial memory.
pub fn build(blueprint: &Blueprint, case: &Case) -> (LaunchConfig, Vec<KernelArg>, Layout) {
    let shape = with_kind!(blueprint.kind(), |k| k.case_shape(case.dims));
    // Validation refuses a shape whose buffers do not fit: the cases are small.
    let elements: Vec<usize> = blueprint
        .buffer_elements(&shape)
        .into_iter()
        .map(|count| count.expect("a small case") as usize)
        .collect();
    let lens: Vec<usize> = elements.iter().map(|e| 4 * (e + case.slack)).collect();
    let mut layout = Layout::new(&lens);
    let mut rng = Rng(case.seed);
    let inputs = elements.len() - 1;
    for (index, &count) in elements.iter().enumerate().take(inputs) {
        let words: Vec<u32> = (0..count)
            .map(|_| {
                with_kind!(blueprint.kind(), |k| k.case_input(
                    blueprint.dtype(),
                    index,
                    &shape,
                    &mut rng
                ))
            })
            .collect();
        layout.write(index, &words);
    }
    let scalars = shape.sizes();
    let (mut buffer, mut scalar) = (0, 0);
    let mut args: Vec<KernelArg> = blueprint
        .params()
        .iter()
        .map(|param| match param.kind {
            ParamKind::Input | ParamKind::Output => {
                buffer += 1;
                layout.arg(buffer - 1)
            }
            ParamKind::U32 => {
                scalar += 1;
                KernelArg::U32(scalars[scalar - 1])
            }
            ParamKind::F32 => KernelArg::F32(f32::from_bits(rng.f32_bits())),
            ParamKind::I32 => KernelArg::I32(rng.i32_bits() as i32),
        })
        .collect();
    if case.in_place && with_kind!(blueprint.kind(), |k| k.in_place()) {
        let output = blueprint
            .params()
            .iter()
            .position(|p| p.kind == ParamKind::Output)
            .expect("an output");
        args[output] = layout.arg(0);
    }
    let mut config = blueprint.launch_config(&shape).expect("launch config");
    for axis in 0..blueprint.grid_axes() {
        let grid = i64::from(config.grid[axis]) + i64::from(case.grid_delta[axis]);
        config.grid[axis] = grid.max(1) as u32;
    }
    (config, args, layout)
}

/// One builtin case: three sizes (matmul: m, n, k), the block shape, a grid change per axis
/// and the seed of the input values.
#[derive(Debug, Clone)]
pub struct BuiltinCase {
    pub dims: [u32; 3],
    pub block: [u32; 2],
    pub grid_delta: [i32; 2],
    pub seed: u64,
}

impl BuiltinCase {
    /// A case of `kernel` drawn from `rng`: sizes below 600 (matmul: below 14, blocks of at
    /// most 16 × 16 threads).
    pub fn draw(kernel: BuiltinKernel, rng: &mut Rng) -> Self {
        let (dim, block) = match kernel {
            BuiltinKernel::Matmul => (14, [16, 16]),
            _ => (600, [299, 1]),
        };
        BuiltinCase {
            dims: [0; 3].map(|_: u32| rng.below(dim) as u32),
            block: block.map(|b: u64| 1 + rng.below(b) as u32),
            grid_delta: [0; 2].map(|_: i32| rng.below(4) as i32 - 1),
            seed: rng.next_u64(),
        }
    }
}

/// The fixed cases of `kernel`: `count` cases drawn from a generator named after it.
pub fn builtin_fixed_cases(kernel: BuiltinKernel, count: usize) -> Vec<BuiltinCase> {
    let mut rng = Rng::named(kernel.descriptor());
    (0..count)
        .map(|_| BuiltinCase::draw(kernel, &mut rng))
        .collect()
}

/// The launch of builtin `kernel` for `case`: configuration, arguments and initial memory.
pub fn build_builtin(
    kernel: BuiltinKernel,
    case: &BuiltinCase,
) -> (LaunchConfig, Vec<KernelArg>, Layout) {
    let mut rng = Rng(case.seed);
    let [d0, d1, d2] = case.dims;
    let (lens, inputs, scalars): (Vec<usize>, Vec<usize>, Vec<KernelArg>) = match kernel {
        BuiltinKernel::VectorAdd => {
            let n = d0 as usize;
            (vec![4 * n; 3], vec![n, n], vec![KernelArg::U32(d0)])
        }
        BuiltinKernel::Scale => {
            let n = d0 as usize;
            let alpha = KernelArg::F32(f32::from_bits(rng.f32_bits()));
            (vec![4 * n; 2], vec![n], vec![alpha, KernelArg::U32(d0)])
        }
        BuiltinKernel::Matmul => {
            let (m, n, k) = (d0 as usize, d1 as usize, d2 as usize);
            (
                vec![4 * m * k, 4 * k * n, 4 * m * n],
                vec![m * k, k * n],
                vec![KernelArg::U32(d0), KernelArg::U32(d1), KernelArg::U32(d2)],
            )
        }
    };
    let mut layout = Layout::new(&lens);
    for (index, &count) in inputs.iter().enumerate() {
        layout.fill(index, count, Dtype::F32, &mut rng);
    }
    let mut args: Vec<KernelArg> = (0..lens.len()).map(|i| layout.arg(i)).collect();
    args.extend(scalars);
    let mut config = match kernel {
        BuiltinKernel::Matmul => LaunchConfig::grid_2d(d1, d0, case.block),
        _ => LaunchConfig::linear(d0, case.block[0]),
    };
    let axes = if kernel == BuiltinKernel::Matmul {
        2
    } else {
        1
    };
    for axis in 0..axes {
        let grid = i64::from(config.grid[axis]) + i64::from(case.grid_delta[axis]);
        config.grid[axis] = grid.max(1) as u32;
    }
    (config, args, layout)
}

/// A CUDA C++ test kernel: tenant-style code compiled by NVRTC, not generated by us.
#[derive(Debug, Clone, Copy)]
pub struct CudaKernel {
    /// The `extern "C"` entry point.
    pub entry: &'static str,
    pub source: &'static str,
    /// What the kernel exercises, and why its result is what the reference says.
    pub about: &'static str,
}

/// `tensor-wasm-gpu`'s NVRTC example: negation.
pub const NEGATE: CudaKernel = CudaKernel {
    entry: "negate",
    source: r#"
extern "C" __global__ void negate(const float* x, float* out, unsigned int n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = -x[i];
    }
}
"#,
    about: "negation flips the sign bit",
};

/// The GPU suite's kernel: saxpy with explicitly rounded operations (no contraction).
pub const SAXPY: CudaKernel = CudaKernel {
    entry: "tw_suite_saxpy",
    source: r#"
extern "C" __global__ void tw_suite_saxpy(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}
"#,
    about: "__fmul_rn and __fadd_rn round each operation",
};

/// Plain C++ `a * b + c`, which NVRTC contracts into one `fma` by default.
pub const MULADD: CudaKernel = CudaKernel {
    entry: "muladd",
    source: r#"
extern "C" __global__ void muladd(const float* a, const float* b, const float* c, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * b[i] + c[i];
}
"#,
    about: "NVRTC contracts a * b + c into fma.rn (one rounding): the reference is mul_add",
};

/// A shared-memory tree reduction with `__syncthreads`.
pub const BLOCK_SUM: CudaKernel = CudaKernel {
    entry: "block_sum",
    source: r#"
extern "C" __global__ void block_sum(const int* x, int* out, unsigned int n) {
    __shared__ int buf[128];
    unsigned int t = threadIdx.x;
    unsigned int i = blockIdx.x * 128 + t;
    buf[t] = i < n ? x[i] : 0;
    __syncthreads();
    for (unsigned int s = 64; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}
"#,
    about: "wrapping integer sums per block of 128",
};

/// Dynamic shared memory: each block reverses its slice.
pub const REVERSE: CudaKernel = CudaKernel {
    entry: "reverse",
    source: r#"
extern "C" __global__ void reverse(const float* x, float* out) {
    extern __shared__ float tile[];
    unsigned int t = threadIdx.x;
    unsigned int base = blockIdx.x * blockDim.x;
    tile[t] = x[base + t];
    __syncthreads();
    out[base + t] = tile[blockDim.x - 1 - t];
}
"#,
    about: "a block's slice reversed through dynamic shared memory",
};

/// Every CUDA C++ test kernel: ours, then the corpus ([`crate::corpus`]).
pub const CUDA_KERNELS: [CudaKernel; 13] = [
    NEGATE,
    SAXPY,
    MULADD,
    BLOCK_SUM,
    REVERSE,
    crate::corpus::HISTOGRAM,
    crate::corpus::MEDIAN_STENCIL,
    crate::corpus::GATHER,
    crate::corpus::WARP_SUM,
    crate::corpus::MATMUL_TILED,
    crate::corpus::POLY_CALL,
    crate::corpus::DAXPY_STRIDE,
    crate::corpus::CONV2D,
];

/// One launch of a CUDA C++ test kernel with its expected memory.
#[derive(Debug, Clone)]
pub struct CudaCase {
    pub kernel: CudaKernel,
    pub config: LaunchConfig,
    pub args: Vec<KernelArg>,
    pub layout: Layout,
    /// How to compare words (f32: NaNs are equal).
    pub dtype: Dtype,
    /// The whole memory after the launch, from a Rust reference.
    pub expected: Vec<u8>,
}

/// The launches of [`CUDA_KERNELS`]: ours over 300 elements of edge values each, then the
/// corpus's ([`crate::corpus::cases`]).
pub fn cuda_cases() -> Vec<CudaCase> {
    let mut cases = own_cuda_cases();
    cases.extend(crate::corpus::cases());
    cases
}

fn own_cuda_cases() -> Vec<CudaCase> {
    let mut rng = Rng(0x1234);
    let n = 300u32;
    let count = n as usize;
    let draw = |rng: &mut Rng, dtype| (0..count).map(|_| rng.bits(dtype)).collect::<Vec<_>>();
    let x = draw(&mut rng, Dtype::F32);
    let y = draw(&mut rng, Dtype::F32);
    let c = draw(&mut rng, Dtype::F32);
    let ints = draw(&mut rng, Dtype::I32);
    let f = f32::from_bits;
    let a = 1.5f32;
    let blocks = n.div_ceil(128);
    let launch = |grid: u32, block: u32, shared_bytes: u32| LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        shared_bytes,
    };
    // (kernel, config, dtype, buffer lengths in words, inputs, scalars after the buffers,
    // index of the output, expected output words)
    type Spec = (
        CudaKernel,
        LaunchConfig,
        Dtype,
        Vec<usize>,
        Vec<Vec<u32>>,
        Vec<KernelArg>,
        usize,
        Vec<u32>,
    );
    let specs: Vec<Spec> = vec![
        (
            NEGATE,
            launch(3, 128, 0),
            Dtype::F32,
            vec![count, count],
            vec![x.clone()],
            vec![KernelArg::U32(n)],
            1,
            x.iter().map(|v| v ^ 0x8000_0000).collect(),
        ),
        (
            SAXPY,
            launch(2, 256, 0),
            Dtype::F32,
            vec![count, count],
            vec![x.clone(), y.clone()],
            vec![KernelArg::F32(a), KernelArg::U32(n)],
            1,
            x.iter()
                .zip(&y)
                .map(|(x, y)| (a * f(*x) + f(*y)).to_bits())
                .collect(),
        ),
        (
            MULADD,
            launch(5, 64, 0),
            Dtype::F32,
            vec![count; 4],
            vec![x.clone(), y.clone(), c.clone()],
            vec![KernelArg::I32(n as i32)],
            3,
            (0..count)
                .map(|i| f(x[i]).mul_add(f(y[i]), f(c[i])).to_bits())
                .collect(),
        ),
        (
            BLOCK_SUM,
            launch(blocks, 128, 0),
            Dtype::I32,
            vec![count, blocks as usize],
            vec![ints.clone()],
            vec![KernelArg::U32(n)],
            1,
            ints.chunks(128)
                .map(|chunk| chunk.iter().fold(0u32, |acc, v| acc.wrapping_add(*v)))
                .collect(),
        ),
        (
            REVERSE,
            launch(3, 100, 400),
            Dtype::F32,
            vec![count, count],
            vec![x.clone()],
            vec![],
            1,
            x.chunks(100)
                .flat_map(|c| c.iter().rev().copied())
                .collect(),
        ),
    ];
    specs
        .into_iter()
        .map(
            |(kernel, config, dtype, lens, inputs, scalars, output, result)| {
                let lens: Vec<usize> = lens.iter().map(|words| 4 * words).collect();
                let mut layout = Layout::new(&lens);
                for (index, words) in inputs.iter().enumerate() {
                    layout.write(index, words);
                }
                let mut args: Vec<KernelArg> = (0..lens.len()).map(|i| layout.arg(i)).collect();
                args.extend(scalars);
                let mut after = layout.clone();
                after.write(output, &result);
                CudaCase {
                    kernel,
                    config,
                    args,
                    layout,
                    dtype,
                    expected: after.memory,
                }
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_parses_in_some_dtype_and_the_list_has_no_repeats() {
        let kinds = blueprint_kinds();
        let set: std::collections::BTreeSet<_> = kinds.iter().collect();
        assert_eq!(set.len(), kinds.len());
        for kind in &kinds {
            let parses = |dtype| Blueprint::parse(&format!("{kind}:{dtype}")).is_ok();
            assert!(parses("f32") || parses("i32"), "{kind} parses in no dtype");
        }
        // Every example of every kind of the catalogue is in the set.
        for name in crate::KIND_NAMES {
            assert!(
                kinds.iter().any(|k| k.starts_with(&format!("{name}["))),
                "{name}"
            );
        }
    }

    #[test]
    fn fixed_cases_depend_on_the_name_alone() {
        let blueprint = Blueprint::parse("matmul[4x4x8]:i32").unwrap();
        let one = fixed_cases(&blueprint, 3);
        let again = fixed_cases(&blueprint, 5);
        for (a, b) in one.iter().zip(&again) {
            assert_eq!(build(&blueprint, a).2.memory, build(&blueprint, b).2.memory);
        }
        let other = fixed_cases(&Blueprint::parse("matmul[4x4x8]:f32").unwrap(), 1);
        assert_ne!(one[0].seed, other[0].seed);
    }

    #[test]
    fn the_blueprint_cases_match_run_cpu_over_their_whole_memory() {
        // The CPU reference runs every fixed case and leaves every canary in place.
        for blueprint in blueprints() {
            for case in fixed_cases(&blueprint, 2) {
                let (config, args, layout) = build(&blueprint, &case);
                let mut memory = layout.memory.clone();
                blueprint.run_cpu(&config, &args, &mut memory).unwrap();
                let outputs: Vec<(usize, usize)> = blueprint
                    .params()
                    .iter()
                    .zip(&args)
                    .filter(|(p, _)| p.kind == ParamKind::Output)
                    .map(|(_, arg)| match *arg {
                        KernelArg::Buffer { offset, len } => (offset as usize, len as usize),
                        _ => unreachable!("outputs are buffers"),
                    })
                    .collect();
                for (i, (before, after)) in layout
                    .memory
                    .chunks_exact(4)
                    .zip(memory.chunks_exact(4))
                    .enumerate()
                {
                    let in_output = outputs.iter().any(|&(o, l)| (o..o + l).contains(&(4 * i)));
                    assert!(in_output || before == after, "{blueprint}: byte {}", 4 * i);
                }
            }
        }
    }

    #[test]
    fn the_cuda_cases_expect_a_changed_output_and_nothing_else() {
        for case in cuda_cases() {
            assert_ne!(case.layout.memory, case.expected, "{}", case.kernel.entry);
            assert_eq!(case.layout.memory.len(), case.expected.len());
            assert!(first_difference(case.dtype, &case.expected, &case.expected).is_none());
        }
    }

    #[test]
    fn first_difference_names_the_word_and_ignores_nan_payloads_for_f32() {
        let a = [0x7fc0_0001u32, 1, CANARY]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<_>>();
        let b = [0xffc0_0000u32, 1, 7]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<_>>();
        let f32_diff = first_difference(Dtype::F32, &a, &b).unwrap();
        assert!(
            f32_diff.starts_with("1 word(s) differ; first at byte 8"),
            "{f32_diff}"
        );
        assert!(f32_diff.contains("a canary"), "{f32_diff}");
        let i32_diff = first_difference(Dtype::I32, &a, &b).unwrap();
        assert!(
            i32_diff.starts_with("2 word(s) differ; first at byte 0"),
            "{i32_diff}"
        );
    }
}
