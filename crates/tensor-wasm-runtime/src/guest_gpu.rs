//! Host side of the `wasi:cuda` ABI: per-instance kernel handles and the
//! linker functions guests import (see [`crate::abi`] for the contract).

use std::sync::Arc;

use tensor_wasm_dispatch::{DispatchError, KernelDispatcher};
use tensor_wasm_gpu::{Backend, BuiltinKernel, GpuError, Kernel, LaunchConfig};
use wasmtime::{Caller, Extern, Linker};

use crate::abi::{self, code, AbiError};
use crate::runtime::InvocationState;

/// What every instance shares: the backend and the dispatcher.
#[derive(Debug)]
pub(crate) struct GpuShared {
    pub backend: Arc<dyn Backend>,
    pub dispatcher: KernelDispatcher,
}

/// Per-instance state of a guest that imports `wasi:cuda`.
pub(crate) struct GuestGpu {
    shared: Arc<GpuShared>,
    kernels: Vec<Kernel>,
    last_error: String,
    raw_ptx: bool,
}

impl GuestGpu {
    pub(crate) fn new(shared: Arc<GpuShared>, raw_ptx: bool) -> Self {
        GuestGpu {
            shared,
            kernels: Vec::new(),
            last_error: String::new(),
            raw_ptx,
        }
    }

    fn add_kernel(&mut self, kernel: Kernel) -> Result<i32, Failure> {
        if self.kernels.len() >= abi::MAX_KERNELS_PER_INSTANCE {
            return Err(Failure::Abi(AbiError::new(
                code::LIMIT_EXCEEDED,
                format!(
                    "an instance may create at most {} kernels",
                    abi::MAX_KERNELS_PER_INSTANCE
                ),
            )));
        }
        self.kernels.push(kernel);
        Ok((self.kernels.len() - 1) as i32)
    }
}

/// Why a host call failed: an error code for the guest, or a condition that
/// ends the invocation (the dispatcher is saturated: the client gets 429).
enum Failure {
    Abi(AbiError),
    Saturated(DispatchError),
}

impl From<AbiError> for Failure {
    fn from(e: AbiError) -> Self {
        Failure::Abi(e)
    }
}

impl From<GpuError> for Failure {
    fn from(e: GpuError) -> Self {
        let code = match &e {
            GpuError::InvalidArgument(_) => code::INVALID_ARGUMENT,
            GpuError::NotAvailable(_) => code::NOT_AVAILABLE,
            _ => code::DEVICE_ERROR,
        };
        Failure::Abi(AbiError::new(code, e.to_string()))
    }
}

/// Runs `f` with the caller's memory and GPU state, turning failures into
/// guest error codes (recorded for `last_error`) or traps.
fn with_gpu(
    caller: &mut Caller<'_, InvocationState>,
    f: impl FnOnce(&mut [u8], &mut GuestGpu) -> Result<i32, Failure>,
) -> wasmtime::Result<i32> {
    let memory = caller.get_export("memory").and_then(Extern::into_memory);
    let Some(memory) = memory else {
        if let Some(gpu) = caller.data_mut().gpu.as_mut() {
            gpu.last_error = "the module must export its linear memory as `memory`".into();
        }
        return Ok(code::INVALID_ARGUMENT);
    };
    let (bytes, state) = memory.data_and_store_mut(caller);
    let gpu = state
        .gpu
        .as_mut()
        .expect("instances of modules importing wasi:cuda carry GPU state");
    match f(bytes, gpu) {
        Ok(v) => Ok(v),
        Err(Failure::Abi(e)) => {
            gpu.last_error = e.message;
            Ok(e.code)
        }
        Err(Failure::Saturated(e)) => Err(wasmtime::Error::new(e)),
    }
}

/// Adds the `wasi:cuda` functions to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<InvocationState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        abi::MODULE,
        "kernel_from_blueprint",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let desc = abi::guest_str(mem, ptr, len, "descriptor")?;
                let builtin = BuiltinKernel::from_descriptor(desc.trim()).ok_or_else(|| {
                    AbiError::new(
                        code::INVALID_ARGUMENT,
                        format!(
                            "unknown blueprint `{desc}`: built-in kernels are vector_add, scale, \
                             matmul"
                        ),
                    )
                })?;
                let kernel = gpu.shared.backend.load_builtin(builtin)?;
                gpu.add_kernel(kernel)
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "kernel_from_ptx",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32, eptr: i32, elen: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                if !gpu.raw_ptx {
                    return Err(AbiError::new(
                        code::PERMISSION_DENIED,
                        "raw PTX is a capability this function was not granted (deploy with \
                         raw_ptx=true on a server started with --allow-raw-ptx)",
                    )
                    .into());
                }
                let ptx = abi::guest_str(mem, ptr, len, "PTX")?;
                let entry = abi::guest_str(mem, eptr, elen, "entry name")?;
                let kernel = gpu.shared.backend.load_ptx(&ptx, &entry)?;
                gpu.add_kernel(kernel)
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "kernel_from_cuda",
        |mut caller: Caller<'_, InvocationState>, _: i32, _: i32, _: i32, _: i32| {
            with_gpu(&mut caller, |_, _| {
                Err(AbiError::new(
                    code::NOT_AVAILABLE,
                    "CUDA C++ kernels (NVRTC) are not built yet; use a built-in blueprint",
                )
                .into())
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "launch",
        |mut caller: Caller<'_, InvocationState>,
         handle: i32,
         gx: i32,
         gy: i32,
         gz: i32,
         bx: i32,
         by: i32,
         bz: i32,
         shared_bytes: i32,
         args_ptr: i32,
         args_len: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let kernel = usize::try_from(handle)
                    .ok()
                    .and_then(|h| gpu.kernels.get(h))
                    .cloned()
                    .ok_or_else(|| {
                        AbiError::new(code::BAD_HANDLE, format!("no kernel with handle {handle}"))
                    })?;
                let config = LaunchConfig {
                    grid: [gx as u32, gy as u32, gz as u32],
                    block: [bx as u32, by as u32, bz as u32],
                    shared_bytes: shared_bytes as u32,
                };
                let args = abi::parse_args(mem, args_ptr, args_len)?;
                let shared = gpu.shared.clone();
                let permit = shared
                    .dispatcher
                    .acquire_blocking()
                    .map_err(Failure::Saturated)?;
                tensor_wasm_gpu::launch(
                    &*shared.backend,
                    &kernel,
                    &config,
                    &args,
                    mem,
                    |completion| shared.dispatcher.track(permit, completion).wait(),
                )??;
                Ok(code::OK)
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "sync",
        |mut caller: Caller<'_, InvocationState>| with_gpu(&mut caller, |_, _| Ok(code::OK)),
    )?;
    linker.func_wrap(
        abi::MODULE,
        "last_error",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let message = gpu.last_error.as_bytes();
                let start = ptr as u32 as usize;
                let room = (len as u32 as usize).min(message.len());
                let dest = start
                    .checked_add(room)
                    .filter(|&end| end <= mem.len())
                    .ok_or_else(|| {
                        AbiError::new(code::INVALID_ARGUMENT, "last_error buffer is out of bounds")
                    })?;
                mem[start..dest].copy_from_slice(&message[..room]);
                Ok(message.len() as i32)
            })
        },
    )?;
    Ok(())
}
