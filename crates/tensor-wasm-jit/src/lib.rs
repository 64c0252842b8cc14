//! Kernel blueprints for TensorWasm: typed kernel descriptions that guests name by a short
//! text descriptor, with bounds-safe launch contracts, an exact CPU implementation and a PTX
//! emitter.
//!
//! A guest asks for a kernel by descriptor (`vector_add[4]:f32`, `elementwise[relu]`,
//! `reduce[sum]:i32`, `matmul[16x16x16]`, `conv2d[3x3,s1,p1]`; grammar on [`Blueprint`]).
//! The host parses it into a [`Blueprint`] and then, for each launch:
//!
//! - [`Blueprint::validate_launch`] checks the arguments and launch configuration against the
//!   blueprint's launch contract ([`Blueprint::params`], [`Blueprint::launch_config`]), so
//!   that no covered index can reach outside a buffer or the guest memory;
//! - [`Blueprint::run_cpu`] computes the result on the CPU (in resumable steps with
//!   [`Blueprint::cpu_run`]), or
//! - [`Blueprint::emit_ptx`] produces PTX for a [`PtxTarget`] chosen from the device and driver
//!   ([`PtxTarget::for_device`]); the kernel additionally guards every global access by the
//!   shape.
//!
//! Both paths compute bit-identical results (NaN payloads aside): the same per-element order of
//! separately rounded f32 operations, wrapping i32 arithmetic, and a fixed reduction tree. A
//! [`Fingerprint`] names the emitted code for caching. [`CompiledBlueprint`] adapts a blueprint
//! to `tensor_wasm_gpu::KernelProgram`.
//!
//! ```
//! use tensor_wasm_gpu::KernelArg;
//! use tensor_wasm_jit::{Blueprint, PtxTarget, Shape};
//!
//! let blueprint: Blueprint = "matmul[16x16x16]".parse()?;
//! let (m, n, k) = (2u32, 3u32, 2u32);
//! let config = blueprint.launch_config(&Shape::Matmul { m, n, k })?;
//! assert_eq!(config.block, [16, 16, 1]);
//!
//! // a = [[1, 2], [3, 4]] at 0, b = [[1, 0, 1], [0, 1, 1]] at 16, c (2 x 3) at 40.
//! let mut memory = vec![0u8; 64];
//! let values = [1.0f32, 2.0, 3.0, 4.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0];
//! for (i, value) in values.iter().enumerate() {
//!     let at = if i < 4 { 4 * i } else { 16 + 4 * (i - 4) };
//!     memory[at..at + 4].copy_from_slice(&value.to_le_bytes());
//! }
//! let args = [
//!     KernelArg::Buffer { offset: 0, len: 16 },
//!     KernelArg::Buffer { offset: 16, len: 24 },
//!     KernelArg::Buffer { offset: 40, len: 24 },
//!     KernelArg::U32(m),
//!     KernelArg::U32(n),
//!     KernelArg::U32(k),
//! ];
//! blueprint.run_cpu(&config, &args, &mut memory)?;
//! let c: Vec<f32> = memory[40..64]
//!     .chunks_exact(4)
//!     .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
//!     .collect();
//! assert_eq!(c, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
//!
//! // A buffer too small for the shape is refused before anything runs.
//! let mut short = args;
//! short[2] = KernelArg::Buffer { offset: 40, len: 20 };
//! assert!(blueprint.validate_launch(&config, &short, memory.len()).is_err());
//!
//! let ptx = blueprint.emit_ptx(&PtxTarget::for_device((9, 0), 13000)?);
//! assert!(ptx.contains(".visible .entry tw_matmul_16x16x16_f32("));
//! # Ok::<(), tensor_wasm_jit::JitError>(())
//! ```

mod blueprint;
mod cache;
pub mod conformance;
mod contract;
pub mod corpus;
mod cpu;
mod cpu_parts;
#[cfg(test)]
mod cpu_tests;
mod emit;
mod error;
mod fingerprint;
mod fma;
mod gather;
mod kinds;
pub mod math;
mod program;
mod target;

pub use blueprint::{Blueprint, Dtype, MAX_DESCRIPTOR_LEN};
pub use cache::{CacheKey, CompiledKernel, KernelCache, KernelCacheConfig, KernelCacheMetrics};
pub use contract::{Param, ParamKind, Shape, BLOCK_1D, MAX_SIZES};
pub use cpu::CpuRun;
pub use emit::EMITTER_VERSION;
pub use error::JitError;
pub use fingerprint::Fingerprint;
pub use kinds::bmm::{BmmLayout, BmmOperand};
pub use kinds::chain::{Chain, ChainOp, MAX_CHAIN_OPS, MIN_CHAIN_OPS};
pub use kinds::concat::ConcatInputs;
pub use kinds::conv2d::{conv2d_output_size, Conv2dParams};
pub use kinds::dwconv::DepthwiseConv2d;
pub use kinds::elementwise::ElementwiseOp;
pub use kinds::gather::GatherRows;
pub use kinds::layernorm::LayerNormRows;
pub use kinds::matmul::MatmulTile;
pub use kinds::permute::Permutation;
pub use kinds::pool::{AvgPool, MaxPool};
pub use kinds::reduce::ReduceOp;
pub use kinds::softmax::SoftmaxAxis;
pub use kinds::vector_add::Lanes;
pub use kinds::{BlueprintKind, KIND_NAMES};
pub use program::CompiledBlueprint;
pub use target::{ptx_isa_for_driver, PtxTarget, DRIVER_PTX_ISA};
