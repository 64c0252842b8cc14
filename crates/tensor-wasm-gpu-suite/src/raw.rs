//! The raw-CUDA peer: the same kernel text loaded and launched with cudarc directly (no
//! lanes, dispatcher or completion thread), on the calling thread, through
//! `tensor_wasm_gpu::RawCudaKernel`; and what the suite asks the driver besides.

use std::sync::Arc;

use anyhow::{anyhow, Context as _};
use cudarc::driver::{sys, CudaContext, CudaStream};
use tensor_wasm_gpu::{BuiltinKernel, CudaDeviceInfo, RawCudaKernel};
use tensor_wasm_jit::CompiledBlueprint;

/// `descriptor` (a builtin or a blueprint) loaded into `ctx` from the PTX the backend itself
/// loads on the device `info` describes.
pub fn load(
    ctx: &Arc<CudaContext>,
    info: &CudaDeviceInfo,
    descriptor: &str,
) -> anyhow::Result<RawCudaKernel> {
    let kernel = match BuiltinKernel::from_descriptor(descriptor) {
        Some(builtin) => RawCudaKernel::builtin(ctx, builtin)?,
        None => {
            let program = Arc::new(CompiledBlueprint::parse(descriptor)?);
            RawCudaKernel::program(ctx, info, program)?
        }
    };
    Ok(kernel)
}

/// The device's theoretical memory bandwidth in bytes/s from its memory clock and bus
/// width, when the driver reports them.
pub fn peak_bandwidth(ctx: &Arc<CudaContext>) -> Option<f64> {
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
    };
    let clock_khz = ctx.attribute(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).ok()?;
    let bus_bits = ctx
        .attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
        .ok()?;
    (clock_khz > 0 && bus_bits > 0)
        .then(|| 2.0 * f64::from(clock_khz) * 1e3 * f64::from(bus_bits) / 8.0)
}

/// A new stream of `ctx`.
pub fn stream(ctx: &Arc<CudaContext>) -> anyhow::Result<Arc<CudaStream>> {
    ctx.new_stream()
        .map_err(|e| anyhow!("cuStreamCreate: {e}"))
        .context("raw peer stream")
}
