//! The exported C ABI: each CUDA driver function TensorWasm calls through cudarc 0.19, under
//! the exact (versioned) symbol name cudarc looks up. Each reads its arguments, calls the
//! [`Driver`](crate::driver::Driver), writes its out-pointers and records the call in the
//! trace.
//!
//! The functions are `unsafe extern "C"`: their contract is the CUDA driver API's (valid
//! out-pointers, NUL-terminated strings, a `kernelParams` array with one pointer per
//! parameter), which callers through cudarc keep.

// The driver API's documentation is the safety contract of every function here.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::config::{config, trace, FaultAt};
use crate::driver::{code, current, driver, error_text, set_current, Outcome};
use crate::memory::fill;
use crate::streams::wait_until;
use crate::DEVICE_NAME;

type Handle = *mut c_void;

/// Records `name` with its result in the trace and returns the result code.
fn traced(name: &str, outcome: Outcome<()>) -> u32 {
    let result = outcome.err().unwrap_or(code::SUCCESS);
    trace(name, result);
    result
}

/// Writes `value` through `out`, or fails for a null pointer.
unsafe fn put<T>(out: *mut T, value: T) -> Outcome<()> {
    if out.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: the caller passes a valid, aligned out-pointer (checked non-null above).
    unsafe { out.write(value) };
    Ok(())
}

fn device(ordinal: c_int) -> Outcome<()> {
    if ordinal == 0 {
        Ok(())
    } else {
        Err(code::INVALID_DEVICE)
    }
}

/// The memory size reported: the configured size.
fn total_bytes() -> u64 {
    config().memory_bytes
}

// ---- init, version, device --------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuInit(_flags: c_uint) -> u32 {
    traced("cuInit", Ok(()))
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> u32 {
    traced("cuDriverGetVersion", put(version, config().driver_version))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> u32 {
    traced("cuDeviceGetCount", put(count, 1))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(out: *mut c_int, ordinal: c_int) -> u32 {
    let outcome = device(ordinal).and_then(|()| put(out, ordinal));
    traced("cuDeviceGet", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> u32 {
    let outcome = device(dev).and_then(|()| {
        let len = usize::try_from(len).map_err(|_| code::INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(code::INVALID_VALUE);
        }
        let bytes = DEVICE_NAME.as_bytes();
        let copied = bytes.len().min(len - 1);
        // SAFETY: `name` has room for `len` bytes (the API's contract); `copied + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), copied);
            name.add(copied).write(0);
        }
        Ok(())
    });
    traced("cuDeviceGetName", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> u32 {
    let outcome = device(dev).and_then(|()| put(bytes, total_bytes() as usize));
    traced("cuDeviceTotalMem_v2", outcome)
}

/// The attributes an sm_90-class device reports (those not listed: 0).
fn attribute(attribute: u32) -> c_int {
    match attribute {
        1 => 1024,                            // MAX_THREADS_PER_BLOCK
        2 => 1024,                            // MAX_BLOCK_DIM_X
        3 => 1024,                            // MAX_BLOCK_DIM_Y
        4 => 64,                              // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                        // MAX_GRID_DIM_X
        6 | 7 => 65535,                       // MAX_GRID_DIM_Y, _Z
        8 => 48 * 1024,                       // MAX_SHARED_MEMORY_PER_BLOCK
        10 => 32,                             // WARP_SIZE
        16 => 132,                            // MULTIPROCESSOR_COUNT
        75 => 9,                              // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                              // COMPUTE_CAPABILITY_MINOR
        83 => 1,                              // MANAGED_MEMORY
        88 => c_int::from(config().pageable), // PAGEABLE_MEMORY_ACCESS
        89 => 1,                              // CONCURRENT_MANAGED_ACCESS
        97 => 227 * 1024,                     // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        115 => 0, // MEMORY_POOLS_SUPPORTED: no pools, so cudarc frees synchronously
        _ => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attrib: u32, dev: c_int) -> u32 {
    let outcome = device(dev).and_then(|()| put(value, attribute(attrib)));
    traced("cuDeviceGetAttribute", outcome)
}

// ---- contexts ---------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, dev: c_int) -> u32 {
    let outcome = device(dev).and_then(|()| {
        let handle = driver().retain_primary();
        put(ctx, handle as Handle)
    });
    traced("cuDevicePrimaryCtxRetain", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> u32 {
    let outcome = device(dev).and_then(|()| driver().release_primary());
    traced("cuDevicePrimaryCtxRelease_v2", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut Handle,
    _params: *mut c_void,
    _flags: c_uint,
    dev: c_int,
) -> u32 {
    let outcome = device(dev).and_then(|()| {
        let handle = driver().create_context();
        // A new context becomes current, as with the real driver.
        set_current(handle);
        put(ctx, handle as Handle)
    });
    traced("cuCtxCreate_v4", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> u32 {
    traced("cuCtxDestroy_v2", driver().destroy_context(ctx as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> u32 {
    let ctx = ctx as usize;
    let outcome = if ctx == 0 || driver().is_context(ctx) {
        set_current(ctx);
        Ok(())
    } else {
        Err(code::INVALID_CONTEXT)
    };
    traced("cuCtxSetCurrent", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> u32 {
    traced("cuCtxGetCurrent", put(ctx, current() as Handle))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> u32 {
    let ctx = current();
    let outcome = wait_until(driver(), |d| !d.context_busy(ctx)).report(ctx, FaultAt::Sync);
    traced("cuCtxSynchronize", outcome)
}

// ---- streams and events -----------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, _flags: c_uint) -> u32 {
    let outcome = driver()
        .create_stream()
        .and_then(|handle| put(stream, handle as Handle));
    traced("cuStreamCreate", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: Handle) -> u32 {
    traced(
        "cuStreamDestroy_v2",
        driver().destroy_stream(stream as usize),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: Handle) -> u32 {
    let mut driver = wait_until(driver(), |d| !d.busy(stream as usize));
    let outcome = driver
        .stream_context(stream as usize)
        .and_then(|ctx| driver.report(ctx, FaultAt::Sync));
    traced("cuStreamSynchronize", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> u32 {
    let outcome = driver()
        .create_event()
        .and_then(|handle| put(event, handle as Handle));
    traced("cuEventCreate", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: Handle) -> u32 {
    traced("cuEventDestroy_v2", driver().destroy_event(event as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> u32 {
    let mut driver = driver();
    let outcome = driver.event_context(event as usize).and_then(|ctx| {
        if driver.stream_context(stream as usize)? != ctx {
            return Err(code::INVALID_HANDLE);
        }
        driver.report(ctx, FaultAt::EventRecord)?;
        driver.record_event(event as usize, stream as usize);
        Ok(())
    });
    traced("cuEventRecord", outcome)
}

/// Waits until the work recorded before the event is done, then reports a fault.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: Handle) -> u32 {
    let mut driver = wait_until(driver(), |d| d.event_done(event as usize));
    let outcome = driver
        .event_context(event as usize)
        .and_then(|ctx| driver.report(ctx, FaultAt::Sync));
    traced("cuEventSynchronize", outcome)
}

/// Elapsed time between two events: host time between their records, which spans the
/// interpreter's work (nothing measured here is a GPU time).
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: Handle, end: Handle) -> u32 {
    let driver = driver();
    let outcome = driver
        .event_context(end as usize)
        .and_then(|ctx| driver.check(ctx))
        .and_then(|()| driver.elapsed_ms(start as usize, end as usize))
        .and_then(|elapsed| put(ms, elapsed));
    traced("cuEventElapsedTime_v2", outcome)
}

// ---- memory -----------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, bytes: usize, _flags: c_uint) -> u32 {
    let mut driver = driver();
    let outcome = driver.current_checked().and_then(|_| {
        if bytes == 0 {
            return Err(code::INVALID_VALUE);
        }
        if config().oom || driver.memory.bytes() + bytes as u64 > total_bytes() {
            return Err(code::OUT_OF_MEMORY);
        }
        let base = driver.memory.allocate(bytes).ok_or(code::OUT_OF_MEMORY)?;
        put(dptr, base)
    });
    traced("cuMemAllocManaged", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> u32 {
    // As `cuMemFree` on a device, wait for the launches using the memory.
    let mut driver = wait_until(driver(), |d| !d.in_use(dptr));
    driver.host_preferred.remove(&dptr);
    let outcome = if driver.memory.free(dptr) {
        Ok(())
    } else {
        Err(code::INVALID_VALUE)
    };
    traced("cuMemFree_v2", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> u32 {
    let driver = driver();
    let outcome = driver.current_checked().and_then(|_| {
        let total_bytes = total_bytes();
        let free_bytes = total_bytes.saturating_sub(driver.memory.bytes());
        put(free, free_bytes as usize).and_then(|()| put(total, total_bytes as usize))
    });
    traced("cuMemGetInfo_v2", outcome)
}

/// `CUmemLocation`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    kind: u32,
    id: c_int,
}

/// Checks that a range lies in one allocation, for advice and prefetches (which change
/// nothing here: host memory is where the data already is).
fn in_allocation(address: u64, len: usize) -> Outcome<()> {
    if driver().memory.contains(address, len) {
        Ok(())
    } else {
        Err(code::INVALID_VALUE)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAdvise_v2(
    dptr: u64,
    len: usize,
    advice: u32,
    location: MemLocation,
) -> u32 {
    let outcome = in_allocation(dptr, len).map(|()| {
        // A host-preferred allocation of one word is a launch's live word (`streams.rs`).
        if (advice, location.kind) == (ADVISE_PREFERRED_LOCATION, LOCATION_HOST) {
            driver().host_preferred.insert(dptr);
        }
    });
    traced("cuMemAdvise_v2", outcome)
}

/// `CU_MEM_ADVISE_SET_PREFERRED_LOCATION` and `CU_MEM_LOCATION_TYPE_HOST`.
const ADVISE_PREFERRED_LOCATION: u32 = 3;
const LOCATION_HOST: u32 = 2;

#[no_mangle]
pub unsafe extern "C" fn cuMemPrefetchAsync_v2(
    dptr: u64,
    len: usize,
    _location: MemLocation,
    _flags: c_uint,
    stream: Handle,
) -> u32 {
    let outcome = {
        let driver = driver();
        driver
            .stream_context(stream as usize)
            .and_then(|ctx| driver.check(ctx))
    }
    .and_then(|()| in_allocation(dptr, len));
    traced("cuMemPrefetchAsync_v2", outcome)
}

fn memset(stream: Handle, dptr: u64, value: u8, len: usize) -> Outcome<()> {
    // After the work queued on the stream, as a device orders it.
    let driver = wait_until(driver(), |d| !d.busy(stream as usize));
    let ctx = driver.stream_context(stream as usize)?;
    driver.check(ctx)?;
    if !driver.memory.contains(dptr, len) {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: the range lies inside one live allocation (checked above, under the lock).
    unsafe { fill(dptr, value, len) };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dptr: u64, value: u8, len: usize, stream: Handle) -> u32 {
    traced("cuMemsetD8Async", memset(stream, dptr, value, len))
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: u32, ptr: u64) -> u32 {
    let outcome = driver()
        .memory
        .holding(ptr)
        .ok_or(code::INVALID_VALUE)
        .and_then(|(base, len)| match attribute {
            // IS_MANAGED: an unsigned int (a boolean).
            8 => put(data.cast::<c_uint>(), 1),
            // RANGE_START_ADDR: a CUdeviceptr.
            11 => put(data.cast::<u64>(), base),
            // RANGE_SIZE: a size_t.
            12 => put(data.cast::<usize>(), len),
            _ => Err(code::NOT_SUPPORTED),
        });
    traced("cuPointerGetAttribute", outcome)
}

// ---- modules and launches ---------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> u32 {
    let outcome = if image.is_null() {
        Err(code::INVALID_VALUE)
    } else {
        // SAFETY: a PTX image is NUL-terminated text (the API's contract); a cubin or fatbin
        // begins with its magic number, which `load_module` recognizes in the first bytes
        // before the terminating NUL (ELF and fatbin headers hold zero bytes early on).
        let bytes = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_bytes();
        // SAFETY: as above: at least the 4 magic bytes of a binary image are readable.
        let head = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), 4) };
        let image = if head == b"\x7fELF" || head == [0x50, 0xed, 0x55, 0xba] {
            head
        } else {
            bytes
        };
        driver()
            .load_module(image)
            .and_then(|handle| put(module, handle as Handle))
    };
    traced("cuModuleLoadData", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: Handle) -> u32 {
    traced("cuModuleUnload", driver().unload_module(module as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    function: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> u32 {
    let outcome = if name.is_null() {
        Err(code::INVALID_VALUE)
    } else {
        // SAFETY: `name` is a NUL-terminated string (the API's contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        driver()
            .get_function(module as usize, &name)
            .and_then(|handle| put(function, handle as Handle))
    };
    traced("cuModuleGetFunction", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    function: Handle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> u32 {
    let outcome = driver()
        .param_info(function as usize, index)
        .and_then(|(at, bytes)| put(offset, at).and_then(|()| put(size, bytes)));
    traced("cuFuncGetParamInfo", outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    function: Handle,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> u32 {
    let mut driver = driver();
    let outcome = driver.param_sizes(function as usize).and_then(|sizes| {
        if !extra.is_null() {
            return Err(code::NOT_SUPPORTED);
        }
        if params.is_null() && !sizes.is_empty() {
            return Err(code::INVALID_VALUE);
        }
        let values: Vec<&[u8]> = sizes
            .iter()
            .enumerate()
            .map(|(index, &size)| {
                // SAFETY: `params` holds one pointer per parameter, each to a value of that
                // parameter's size (the API's contract; cudarc passes exactly these).
                unsafe { std::slice::from_raw_parts((*params.add(index)).cast::<u8>(), size) }
            })
            .collect();
        driver.launch(
            function as usize,
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            shared,
            stream as usize,
            &values,
        )
    });
    traced("cuLaunchKernel", outcome)
}

// ---- for NVRTC ------------------------------------------------------------------------

/// NVRTC opens `libcuda.so.1` when present and asks for the driver's private export tables;
/// without this symbol it crashes. The stand-in has none to offer.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(table: *mut *const c_void, _id: *const c_void) -> u32 {
    if !table.is_null() {
        // SAFETY: a non-null out-pointer is valid for one pointer (the API's contract).
        unsafe { table.write(std::ptr::null()) };
    }
    traced("cuGetExportTable", Err(code::NOT_SUPPORTED))
}

// ---- errors -----------------------------------------------------------------------------

unsafe fn error_field(name: &str, error: u32, out: *mut *const c_char, pick_name: bool) -> u32 {
    let outcome = error_text(error)
        .ok_or(code::INVALID_VALUE)
        .and_then(|(error_name, text)| {
            let chosen = if pick_name { error_name } else { text };
            put(out, chosen.as_ptr())
        });
    traced(name, outcome)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: u32, out: *mut *const c_char) -> u32 {
    error_field("cuGetErrorName", error, out, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: u32, out: *mut *const c_char) -> u32 {
    error_field("cuGetErrorString", error, out, false)
}
