//! The raw-CUDA peer: the same kernel text loaded and launched with cudarc directly (no
//! validation, lanes, dispatcher or completion thread), on the calling thread.

use std::sync::Arc;

use anyhow::{anyhow, Context as _};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use tensor_wasm_gpu::{BuiltinKernel, CudaDeviceInfo, KernelArg, KernelProgram, LaunchConfig};
use tensor_wasm_jit::CompiledBlueprint;

/// A function loaded from PTX into a context.
pub struct RawKernel {
    function: CudaFunction,
    _module: Arc<CudaModule>,
}

/// PTX and entry of `descriptor` (a builtin or a blueprint) for the device `info`
/// describes: the text the backend itself loads.
pub fn kernel_ptx(info: &CudaDeviceInfo, descriptor: &str) -> anyhow::Result<(String, String)> {
    if let Some(builtin) = BuiltinKernel::from_descriptor(descriptor) {
        return Ok((builtin.ptx().to_owned(), builtin.descriptor().to_owned()));
    }
    let program = CompiledBlueprint::parse(descriptor)?;
    let (ptx, entry) = program.ptx(info.compute_capability, info.driver_version)?;
    Ok((ptx.to_string(), entry))
}

/// Loads `entry` from `ptx` into `ctx`.
pub fn load(ctx: &Arc<CudaContext>, ptx: &str, entry: &str) -> anyhow::Result<RawKernel> {
    let module = ctx
        .load_module(Ptx::from_src(ptx))
        .map_err(|e| anyhow!("cuModuleLoadData: {e}"))?;
    let function = module
        .load_function(entry)
        .map_err(|e| anyhow!("cuModuleGetFunction {entry}: {e}"))?;
    Ok(RawKernel {
        function,
        _module: module,
    })
}

enum Param {
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

/// Enqueues `kernel` on `stream` with `args`, buffers as addresses `base + offset`.
///
/// # Safety
/// The buffers must lie inside live memory at `base` that the device can reach, and must
/// stay alive and untouched by the host until the stream has finished the kernel; the
/// arguments must match the kernel's parameters.
pub unsafe fn launch(
    stream: &Arc<CudaStream>,
    kernel: &RawKernel,
    config: &LaunchConfig,
    args: &[KernelArg],
    base: u64,
) -> anyhow::Result<()> {
    let params: Vec<Param> = args
        .iter()
        .map(|arg| match *arg {
            KernelArg::I32(v) => Param::I32(v),
            KernelArg::U32(v) => Param::U32(v),
            KernelArg::I64(v) => Param::I64(v),
            KernelArg::U64(v) => Param::U64(v),
            KernelArg::F32(v) => Param::F32(v),
            KernelArg::F64(v) => Param::F64(v),
            KernelArg::Buffer { offset, .. } => Param::U64(base + offset),
        })
        .collect();
    let mut builder = stream.launch_builder(&kernel.function);
    for param in &params {
        match param {
            Param::I32(v) => builder.arg(v),
            Param::U32(v) => builder.arg(v),
            Param::I64(v) => builder.arg(v),
            Param::U64(v) => builder.arg(v),
            Param::F32(v) => builder.arg(v),
            Param::F64(v) => builder.arg(v),
        };
    }
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (config.grid[0], config.grid[1], config.grid[2]),
        block_dim: (config.block[0], config.block[1], config.block[2]),
        shared_mem_bytes: config.shared_bytes,
    };
    // SAFETY: the caller guarantees the parameters match and the memory stays valid until
    // the stream is done.
    unsafe { builder.launch(cfg) }.map_err(|e| anyhow!("cuLaunchKernel: {e}"))?;
    Ok(())
}

/// A pair of timing events.
pub struct Timer {
    start: CudaEvent,
    end: CudaEvent,
}

impl Timer {
    pub fn new(ctx: &Arc<CudaContext>) -> anyhow::Result<Self> {
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| anyhow!("cuEventCreate: {e}"))
        };
        Ok(Timer {
            start: event()?,
            end: event()?,
        })
    }

    pub fn start(&self, stream: &CudaStream) -> anyhow::Result<()> {
        self.start
            .record(stream)
            .map_err(|e| anyhow!("cuEventRecord: {e}"))
    }

    /// Records the end, waits for it and returns the time between the events in ns.
    pub fn stop_ns(&self, stream: &CudaStream) -> anyhow::Result<f64> {
        self.end
            .record(stream)
            .map_err(|e| anyhow!("cuEventRecord: {e}"))?;
        self.end
            .synchronize()
            .map_err(|e| anyhow!("cuEventSynchronize: {e}"))?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| anyhow!("cuEventElapsedTime: {e}"))?;
        Ok(f64::from(ms) * 1e6)
    }
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
