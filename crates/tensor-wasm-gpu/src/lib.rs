//! GPU backends for TensorWasm: device discovery, the builtin kernels, host-described kernel
//! programs, tenant PTX, cubin and CUDA C++ (through NVRTC), and launches over guest linear
//! memory that finish through a [`Completion`].
//!
//! # Overview
//!
//! - [`discover`] lists the CUDA devices of the host, or says why there are none; it never
//!   panics, even without an NVIDIA driver.
//! - [`open_backend`] opens a [`Backend`] for a [`DeviceChoice`]: one CUDA device, or the CPU
//!   backend (a fixed pool of worker threads). `Auto` takes CUDA device 0 when it is usable.
//! - [`Backend::load_builtin`] readies a [`BuiltinKernel`] (`vector_add`, `scale`, `matmul`).
//! - [`Backend::load_program`] readies a [`KernelProgram`]: a kernel host code (the JIT)
//!   describes with its own bounds validation, a CPU implementation and PTX. The CPU backend
//!   runs [`KernelProgram::cpu_steps`] (or [`KernelProgram::run_cpu`]) on its worker pool; a CUDA backend loads
//!   [`KernelProgram::ptx`] for its device, once per [`KernelProgram::fingerprint`].
//! - [`Backend::load_ptx`] and [`Backend::load_cubin`] load tenant code (CUDA only);
//!   [`compile_cuda`] turns tenant CUDA C++ into PTX and a cubin with NVRTC, without a GPU
//!   ([`nvrtc_available`] says whether `libnvrtc.so` loads). Tenant code is only checked for
//!   the count and sizes of its arguments: running it is a trust decision of the caller.
//! - [`launch`] validates the [`KernelArg`]s against guest memory and the [`LaunchConfig`]
//!   against CUDA's limits, launches, and lends the launch's [`Completion`] (which borrows the
//!   guest memory until the kernel is done) to a closure: wait on it there, blocking
//!   ([`Completion::wait_mut`]) or as a future (`&mut Completion` is a `Future + Unpin`).
//!   [`launch`] returns only once the kernel has finished, whatever the closure did.
//! - [`Backend::launch_unscoped`] is the unsafe building block underneath: it returns the
//!   completion itself, and its caller must not leak it (see its `# Safety` section).
//! - Every load of tenant code and every launch carries a [`TenantKey`]. A CUDA backend gives
//!   each tenant a lane of its own at the tenant's [`GpuIsolation`] level: the one the key
//!   names ([`TenantKey::with_isolation`]), else the one the backend was opened with
//!   ([`open_backend_with`]): a stream in one shared context (the default), or a context of
//!   the tenant's own. Lanes of both kinds coexist in one backend. On the CPU backend the key
//!   picks the queue a launch waits in: tenants take turns for its workers, in short slices,
//!   and [`Completion::cancel`] stops a launch at its next slice.
//!
//! Every launch is validated before anything runs: the launch configuration against CUDA's
//! limits, every buffer argument against guest memory, and then the kernel's own rules (the
//! builtins' signatures, [`KernelProgram::validate`], or the parameter layout the driver reports
//! for tenant code).
//!
//! The builtins compute the same thing on both backends, bit for bit: each output element is
//! one thread's work (only the indices the launch grid covers are computed), and the arithmetic
//! is IEEE single precision with separate, round-to-nearest multiplies and adds (no FMA), summed
//! in the same order. (NaN payloads are the one thing that may differ between CPU and GPU.)
//!
//! On CUDA hosts, guest memory must be CUDA managed memory (or any memory, on a device with
//! pageable memory access); this crate never allocates device memory itself.
//!
//! # Example
//!
//! ```
//! use tensor_wasm_gpu::{
//!     launch, open_backend, BuiltinKernel, DeviceChoice, KernelArg, LaunchConfig, TenantKey,
//! };
//!
//! # fn main() -> Result<(), tensor_wasm_gpu::GpuError> {
//! let backend = open_backend(DeviceChoice::Cpu)?;
//! let kernel = backend.load_builtin(BuiltinKernel::VectorAdd)?;
//!
//! // Guest memory: a = [1, 2, 3, 4] at byte 0, b = [10, 20, 30, 40] at 16, out at 32.
//! let mut memory = vec![0u8; 48];
//! let values = [1.0f32, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0];
//! for (i, v) in values.iter().enumerate() {
//!     memory[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
//! }
//! let args = [
//!     KernelArg::Buffer { offset: 0, len: 16 },
//!     KernelArg::Buffer { offset: 16, len: 16 },
//!     KernelArg::Buffer { offset: 32, len: 16 },
//!     KernelArg::U32(4),
//! ];
//! let config = LaunchConfig::linear(4, 256);
//! let tenant = TenantKey::new("tn-example");
//! launch(&*backend, &tenant, &kernel, &config, &args, &mut memory, |completion| {
//!     completion.wait_mut()
//! })??;
//!
//! let out: Vec<f32> = memory[32..]
//!     .chunks_exact(4)
//!     .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
//!     .collect();
//! assert_eq!(out, [11.0, 22.0, 33.0, 44.0]);
//! # Ok(())
//! # }
//! ```
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

mod completion;
mod cpu;
mod cubin;
mod cuda;
mod device;
mod error;
pub mod gemm;
mod isolation;
mod kernel;
mod nvrtc;
mod program;
mod ptx;
mod raw_launch;
mod scoped;
mod validate;

use std::sync::Arc;

pub use completion::{Completion, KernelTimer};
pub use cpu::tenant_ptx::MAX_TENANT_PTX_BYTES;
pub use cuda::set_timing_events as set_cuda_timing_events;
pub use device::{discover, CudaDeviceInfo, Device, DeviceChoice, Discovery};
pub use error::GpuError;
pub use isolation::{
    GpuIsolation, TenantKey, TenantLaneStats, MAX_TENANT_CONTEXTS, MAX_TENANT_STREAMS,
};
pub use kernel::{Backend, BuiltinKernel, Kernel, KernelArg, LaunchConfig};
pub use nvrtc::{compile_cuda, nvrtc_available, nvrtc_version, CudaBinary};
pub use program::{CpuPart, CpuParts, CpuSteps, KernelProgram};
pub use raw_launch::{BlockingSyncEvent, LaunchTimer, RawCudaKernel};
pub use scoped::launch;
pub use validate::{MAX_BLOCK_Z, MAX_GRID_X, MAX_GRID_YZ, MAX_SHARED_BYTES, MAX_THREADS_PER_BLOCK};

/// Opens the backend `choice` names, with the default isolation between tenants
/// ([`GpuIsolation::StreamPerTenant`]); see [`open_backend_with`].
///
/// # Errors
/// As [`open_backend_with`].
pub fn open_backend(choice: DeviceChoice) -> Result<Arc<dyn Backend>, GpuError> {
    open_backend_with(choice, GpuIsolation::default())
}

/// Opens the backend `choice` names, separating tenants on a CUDA device as `isolation` says
/// (for every tenant whose [`TenantKey`] names no level of its own).
///
/// - `Cpu`: the CPU backend (which has no streams or contexts: `isolation` has no effect).
/// - `Cuda`: CUDA device 0; `NotAvailable` (saying why) when the host has no usable device.
/// - `Auto`: CUDA device 0 if it opens, else the CPU backend (the reason is logged).
///
/// # Errors
/// `NotAvailable` or `Cuda` for `Cuda` when CUDA cannot be used; `NotAvailable` when the CPU
/// worker threads cannot be started.
pub fn open_backend_with(
    choice: DeviceChoice,
    isolation: GpuIsolation,
) -> Result<Arc<dyn Backend>, GpuError> {
    let cpu = || -> Result<Arc<dyn Backend>, GpuError> {
        Ok(Arc::new(cpu::CpuBackend::new()?.with_isolation(isolation)))
    };
    match choice {
        DeviceChoice::Cpu => cpu(),
        DeviceChoice::Cuda => Ok(Arc::new(cuda::CudaBackend::open(0, isolation)?)),
        DeviceChoice::Auto => match cuda::CudaBackend::open(0, isolation) {
            Ok(backend) => Ok(Arc::new(backend)),
            Err(reason) => {
                tracing::info!(%reason, "CUDA is not usable; using the CPU backend");
                cpu()
            }
        },
    }
}

#[cfg(test)]
mod program_tests;
#[cfg(test)]
mod standin_tests;
#[cfg(test)]
mod tests;
