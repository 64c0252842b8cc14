//! Driver probing: whether `libcuda.so` loads at all, `cuInit` and the device count, what each
//! device reports, and whether the device can reach a guest's memory. Every driver call runs
//! under [`catching_driver_panics`], which turns a panic inside cudarc into an error.

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, DriverError};

use super::CudaBackend;
use crate::error::driver_error_text;
use crate::{CudaDeviceInfo, GpuError};

/// Runs `probe` unless the driver library is missing; turns panics inside cudarc into errors.
pub(super) fn with_driver<T>(probe: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by its usual names and
    // closes it again; it has no preconditions.
    let present = unsafe { sys::is_culib_present() };
    if !present {
        return Err(GpuError::NotAvailable(String::from(
            "no NVIDIA driver: libcuda.so could not be loaded",
        )));
    }
    catching_driver_panics(probe)
}

/// Runs driver calls, turning a panic inside cudarc (a symbol the installed driver lacks, a
/// string it cannot convert) into an error instead of unwinding through the server.
pub(super) fn catching_driver_panics<T>(
    calls: impl FnOnce() -> Result<T, GpuError>,
) -> Result<T, GpuError> {
    match catch_unwind(AssertUnwindSafe(calls)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(GpuError::NotAvailable(format!(
                "the CUDA driver library is unusable: {message}"
            )))
        }
    }
}

/// `cuInit` and the device count; `NotAvailable` when there is no usable device.
pub(super) fn init_driver() -> Result<usize, GpuError> {
    cudarc::driver::result::init().map_err(|error| {
        GpuError::NotAvailable(format!("cuInit failed: {}", driver_error_text(error)))
    })?;
    let count = cudarc::driver::result::device::get_count().map_err(|error| {
        GpuError::NotAvailable(format!(
            "cuDeviceGetCount failed: {}",
            driver_error_text(error)
        ))
    })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Every CUDA device of this host, or why CUDA cannot be used (the text for `Discovery`).
pub(crate) fn query_all_devices() -> Result<Vec<CudaDeviceInfo>, String> {
    let devices = with_driver(|| {
        let count = init_driver()?;
        let mut devices = Vec::with_capacity(count);
        let mut first_error = None;
        for ordinal in 0..count {
            let info = CudaContext::new(ordinal)
                .map_err(|error| GpuError::cuda("creating a context", error))
                .and_then(|ctx| query_device(&ctx));
            match info {
                Ok(info) => devices.push(info),
                Err(error) => {
                    tracing::warn!(ordinal, %error, "cannot query CUDA device");
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) if devices.is_empty() => Err(error),
            _ => Ok(devices),
        }
    });
    devices.map_err(|error| match error {
        GpuError::NotAvailable(reason)
        | GpuError::Cuda(reason)
        | GpuError::InvalidArgument(reason)
        | GpuError::Cancelled(reason) => reason,
        GpuError::Compile { log } => log,
    })
}

/// What the driver says about the device of `ctx`.
pub(super) fn query_device(ctx: &Arc<CudaContext>) -> Result<CudaDeviceInfo, GpuError> {
    let err = |what: &'static str| move |error: DriverError| GpuError::cuda(what, error);
    let attribute = |attribute: sys::CUdevice_attribute| {
        ctx.attribute(attribute)
            .map_err(err("reading a device attribute"))
    };
    let name = ctx.name().map_err(err("reading the device name"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(err("reading the compute capability"))?;
    let total = ctx.total_mem().map_err(err("reading the memory size"))?;
    let (free, _) = ctx.mem_get_info().map_err(err("reading free memory"))?;
    let mut driver_version: c_int = 0;
    // SAFETY: `driver_version` is a valid place for the one int the driver writes.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(err("reading the driver version"))?;
    let to_u32 = |value: i32| u32::try_from(value).unwrap_or(0);
    Ok(CudaDeviceInfo {
        ordinal: u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX),
        name,
        compute_capability: (to_u32(major), to_u32(minor)),
        driver_version,
        total_memory_bytes: total as u64,
        free_memory_bytes: free as u64,
        pageable_memory_access: attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
        )? != 0,
        concurrent_managed_access: attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
        )? != 0,
        multiprocessor_count: to_u32(attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?),
    })
}

impl CudaBackend {
    /// Checks that the device can address `memory`: CUDA managed memory on a device where host
    /// and device may touch managed memory concurrently (the host keeps running other guests
    /// while a kernel runs), or any host memory on a device with pageable memory access.
    pub(super) fn check_reachable(&self, memory: &[u8]) -> Result<(), GpuError> {
        if memory.is_empty() || self.pageable_memory_access {
            return Ok(());
        }
        if !self.concurrent_managed_access {
            return Err(GpuError::NotAvailable(String::from(
                "this device has neither pageable memory access nor concurrent managed access, \
                 so it cannot run kernels on guest memory while the host keeps running",
            )));
        }
        let base = memory.as_ptr() as u64;
        let end = base + memory.len() as u64;
        // Guest memory was allocated in the primary context; ask about it there.
        self.shared
            .ctx
            .bind_to_thread()
            .map_err(|error| GpuError::cuda("binding the context", error))?;
        let not_reachable = |why: &str| {
            GpuError::NotAvailable(format!(
                "guest memory at {base:#x} ({} bytes) is {why}; this device has no pageable \
                 memory access, so kernels need guest memory in CUDA managed memory",
                memory.len()
            ))
        };
        // The driver writes a boolean (an unsigned int) here; eight zeroed bytes hold it
        // whatever its width.
        let mut is_managed: u64 = 0;
        // SAFETY: `is_managed` is a valid, writable place of 8 bytes, at least as large as the
        // value this attribute writes; the driver only inspects the address `base`.
        let queried = unsafe {
            sys::cuPointerGetAttribute(
                (&mut is_managed as *mut u64).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                base,
            )
        }
        .result();
        match queried {
            Ok(()) if is_managed != 0 => {}
            Ok(()) => return Err(not_reachable("not CUDA managed memory")),
            Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => {
                return Err(not_reachable("not memory the CUDA driver knows"))
            }
            Err(error) => return Err(GpuError::cuda("querying the guest memory", error)),
        }
        let mut range_start: sys::CUdeviceptr = 0;
        let mut range_size: usize = 0;
        // SAFETY: as above; RANGE_START_ADDR writes a CUdeviceptr, RANGE_SIZE a size_t.
        let range = unsafe {
            sys::cuPointerGetAttribute(
                (&mut range_start as *mut sys::CUdeviceptr).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                base,
            )
            .result()
            .and_then(|()| {
                sys::cuPointerGetAttribute(
                    (&mut range_size as *mut usize).cast::<c_void>(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                    base,
                )
                .result()
            })
        };
        range.map_err(|error| GpuError::cuda("querying the guest memory range", error))?;
        let range_end = range_start.saturating_add(range_size as u64);
        if base < range_start || end > range_end {
            return Err(not_reachable("only partly inside one managed allocation"));
        }
        Ok(())
    }
}
