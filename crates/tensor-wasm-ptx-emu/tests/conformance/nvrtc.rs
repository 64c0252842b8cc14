//! The PTX NVRTC makes from the CUDA C++ in our tests (and a few kernels of the shapes tenants
//! write: a shared-memory reduction, dynamic shared memory, contracted multiply-adds), run in
//! the interpreter against Rust references. Skipped, saying so, where NVRTC is not installed.

use std::collections::BTreeSet;

use tensor_wasm_gpu::{compile_cuda, nvrtc_available};
use tensor_wasm_ptx_emu::{launch, Allocation, Launch, Module, Schedule};

use crate::harness::{Rng, COUNTERS};

/// `tensor-wasm-gpu`'s NVRTC test kernel.
const NEGATE: &str = r#"
extern "C" __global__ void negate(const float* x, float* out, unsigned int n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = -x[i];
    }
}
"#;

/// The GPU suite's CUDA C++ kernel.
const SAXPY: &str = r#"
extern "C" __global__ void tw_suite_saxpy(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}
"#;

/// Plain C++ `a * b + c`: NVRTC contracts it into an `fma` by default.
const MULADD: &str = r#"
extern "C" __global__ void muladd(const float* a, const float* b, const float* c, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * b[i] + c[i];
}
"#;

/// A shared-memory tree reduction with `__syncthreads`.
const BLOCK_SUM: &str = r#"
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
"#;

/// Dynamic shared memory: each block reverses its slice.
const REVERSE: &str = r#"
extern "C" __global__ void reverse(const float* x, float* out) {
    extern __shared__ float tile[];
    unsigned int t = threadIdx.x;
    unsigned int base = blockIdx.x * blockDim.x;
    tile[t] = x[base + t];
    __syncthreads();
    out[base + t] = tile[blockDim.x - 1 - t];
}
"#;

const X: u64 = 0x10_0000;
const Y: u64 = 0x20_0000;
const Z: u64 = 0x30_0000;
const W: u64 = 0x40_0000;

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn module(source: &str, entry: &str, used: &mut BTreeSet<String>) -> Module {
    let binary = compile_cuda(source, entry, (8, 0)).unwrap_or_else(|e| panic!("{entry}: {e}"));
    used.extend(crate::opcodes(&binary.ptx));
    Module::parse(&binary.ptx)
        .unwrap_or_else(|e| panic!("NVRTC PTX of {entry}: {e}\n{}", binary.ptx))
}

/// Runs `entry` on `grid` blocks of `block` threads with `dynamic_shared` bytes and `params`
/// over `buffers` (`(base, contents)`), returning the contents.
fn run(
    module: &Module,
    entry: &str,
    [grid, block, dynamic_shared]: [u32; 3],
    params: &[&[u8]],
    buffers: Vec<(u64, Vec<u8>)>,
    schedule: Schedule,
) -> Vec<Vec<u8>> {
    let kernel = module.kernel(entry).expect("entry");
    let packed = kernel.pack_params(params).expect("params");
    let mut buffers = buffers;
    let mut allocs: Vec<Allocation<'_>> = buffers
        .iter_mut()
        .map(|(base, bytes)| Allocation { base: *base, bytes })
        .collect();
    let mut config = Launch::new([grid, 1, 1], [block, 1, 1], &packed).schedule(schedule);
    config.dynamic_shared_bytes = dynamic_shared;
    let stats = launch(kernel, &config, &mut allocs).unwrap_or_else(|e| panic!("{entry}: {e}"));
    COUNTERS.record(&stats);
    COUNTERS.kernel(&format!("nvrtc:{entry}"));
    buffers.into_iter().map(|(_, bytes)| bytes).collect()
}

fn same_f32(expected: &[u32], actual: &[u32], what: &str) {
    for (i, (e, a)) in expected.iter().zip(actual).enumerate() {
        let both_nan = f32::from_bits(*e).is_nan() && f32::from_bits(*a).is_nan();
        assert!(
            e == a || both_nan,
            "{what}[{i}]: expected {e:#010x}, got {a:#010x}"
        );
    }
}

/// Returns whether NVRTC was there to run the section.
pub fn run_all() -> bool {
    if let Err(reason) = nvrtc_available() {
        println!("NVRTC kernels skipped: {reason}");
        return false;
    }
    let mut rng = Rng(0x1234);
    let n = 300u32;
    let x: Vec<u32> = (0..n).map(|_| rng.f32_bits()).collect();
    let y: Vec<u32> = (0..n).map(|_| rng.f32_bits()).collect();
    let c: Vec<u32> = (0..n).map(|_| rng.f32_bits()).collect();
    let ints: Vec<u32> = (0..n).map(|_| rng.i32_bits()).collect();
    let a = 1.5f32;
    let mut used = BTreeSet::new();
    let negate = module(NEGATE, "negate", &mut used);
    let saxpy = module(SAXPY, "tw_suite_saxpy", &mut used);
    let muladd = module(MULADD, "muladd", &mut used);
    let block_sum = module(BLOCK_SUM, "block_sum", &mut used);
    let reverse = module(REVERSE, "reverse", &mut used);
    println!(
        "instructions used by NVRTC's PTX of 5 CUDA C++ kernels: {}",
        used.into_iter().collect::<Vec<_>>().join(" ")
    );
    for schedule in Schedule::ALL {
        let out = run(
            &negate,
            "negate",
            [3, 128, 0],
            &[&X.to_le_bytes(), &Y.to_le_bytes(), &n.to_le_bytes()],
            vec![(X, bytes(&x)), (Y, vec![0; 4 * n as usize])],
            schedule,
        );
        let expected: Vec<u32> = x.iter().map(|v| v ^ 0x8000_0000).collect();
        same_f32(&expected, &words(&out[1]), "negate");

        let out = run(
            &saxpy,
            "tw_suite_saxpy",
            [2, 256, 0],
            &[
                &X.to_le_bytes(),
                &Y.to_le_bytes(),
                &a.to_bits().to_le_bytes(),
                &n.to_le_bytes(),
            ],
            vec![(X, bytes(&x)), (Y, bytes(&y))],
            schedule,
        );
        let expected: Vec<u32> = x
            .iter()
            .zip(&y)
            .map(|(x, y)| (a * f32::from_bits(*x) + f32::from_bits(*y)).to_bits())
            .collect();
        same_f32(&expected, &words(&out[1]), "saxpy");

        let out = run(
            &muladd,
            "muladd",
            [5, 64, 0],
            &[
                &X.to_le_bytes(),
                &Y.to_le_bytes(),
                &Z.to_le_bytes(),
                &W.to_le_bytes(),
                &n.to_le_bytes(),
            ],
            vec![
                (X, bytes(&x)),
                (Y, bytes(&y)),
                (Z, bytes(&c)),
                (W, vec![0; 4 * n as usize]),
            ],
            schedule,
        );
        let expected: Vec<u32> = (0..n as usize)
            .map(|i| {
                f32::from_bits(x[i])
                    .mul_add(f32::from_bits(y[i]), f32::from_bits(c[i]))
                    .to_bits()
            })
            .collect();
        same_f32(&expected, &words(&out[3]), "muladd (contracted to fma)");

        let blocks = n.div_ceil(128);
        let out = run(
            &block_sum,
            "block_sum",
            [blocks, 128, 0],
            &[&X.to_le_bytes(), &Y.to_le_bytes(), &n.to_le_bytes()],
            vec![(X, bytes(&ints)), (Y, vec![0; 4 * blocks as usize])],
            schedule,
        );
        let expected: Vec<u32> = ints
            .chunks(128)
            .map(|chunk| chunk.iter().fold(0u32, |acc, v| acc.wrapping_add(*v)))
            .collect();
        assert_eq!(words(&out[1]), expected, "block_sum");

        let out = run(
            &reverse,
            "reverse",
            [3, 100, 400],
            &[&X.to_le_bytes(), &Y.to_le_bytes()],
            vec![(X, bytes(&x)), (Y, vec![0; 4 * n as usize])],
            schedule,
        );
        let expected: Vec<u32> = x
            .chunks(100)
            .flat_map(|c| c.iter().rev().copied())
            .collect();
        assert_eq!(words(&out[1]), expected, "reverse");
    }
    true
}
