//! CUDA managed (unified) memory buffers, refused before they could overcommit the device.

use std::ffi::c_int;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys::{
    CUdevice_attribute, CUdeviceptr, CUmemAttach_flags, CUmemLocation, CUmemLocationType,
    CUmem_advise, CUstream,
};
use cudarc::driver::{result, CudaContext, CudaStream};

use crate::host::round_up_to_page;
use crate::MemError;

/// The smallest amount of device memory that must stay free after a managed
/// allocation: 256 MiB, enough for the driver, kernel stacks and cuBLAS-style
/// workspaces of the kernels the guests launch.
pub const MIN_DEVICE_HEADROOM_BYTES: u64 = 256 << 20;

/// The share of total device memory, in percent, that must stay free after a
/// managed allocation when it is larger than [`MIN_DEVICE_HEADROOM_BYTES`]
/// (about 7 GB on a 141 GB H200, 4 GB on an 80 GB H100).
pub const DEVICE_HEADROOM_PERCENT: u64 = 5;

/// Serialises "query free memory, then allocate" so that two instantiations in
/// this process cannot both pass the check against the same free bytes.
static MANAGED_ALLOC_LOCK: Mutex<()> = Mutex::new(());

/// The headroom that must remain free on a device with `total` bytes:
/// `max(MIN_DEVICE_HEADROOM_BYTES, total * DEVICE_HEADROOM_PERCENT / 100)`.
pub fn device_headroom(total: u64) -> u64 {
    let share = u128::from(total) * u128::from(DEVICE_HEADROOM_PERCENT) / 100;
    // `share` <= total, so it always fits back into a u64.
    u64::try_from(share)
        .unwrap_or(u64::MAX)
        .max(MIN_DEVICE_HEADROOM_BYTES)
}

/// Refuses a managed allocation of `requested` bytes unless `requested` plus
/// [`device_headroom`]`(total)` fits in `free`.
///
/// Managed memory that exceeds what the device has free does not fail cleanly:
/// oversubscription can stall the whole GPU. So the check happens before
/// `cuMemAllocManaged`, with a margin for the driver and for other tenants.
pub fn check_device_headroom(requested: u64, free: u64, total: u64) -> Result<(), MemError> {
    let needed = requested.saturating_add(device_headroom(total));
    if needed > free {
        return Err(MemError::InsufficientDeviceMemory { requested, free });
    }
    Ok(())
}

/// A zero-filled block of CUDA managed memory (`cuMemAllocManaged` with
/// `CU_MEM_ATTACH_GLOBAL`): one address valid on the host and on every device,
/// page-aligned, freed on drop.
///
/// The block is zeroed on the device right after allocation. Besides the
/// zero-fill guarantee, this populates its pages on the device, so that the next
/// [`ManagedBuffer::new`]'s `cuMemGetInfo` should count them as used (managed
/// pages that were never touched are not backed yet). Not yet measured on a GPU.
///
/// Host access through [`as_slice`](Self::as_slice) and friends must not
/// overlap kernels that write the buffer (as for any guest memory, kernels must
/// be finished or synchronised before the host touches it again), and kernels
/// using the buffer must be finished before it is dropped.
#[derive(Debug)]
pub struct ManagedBuffer {
    ctx: Arc<CudaContext>,
    dptr: CUdeviceptr,
    /// Bytes requested.
    len: usize,
    /// Bytes allocated: `len` rounded up to the host page size, at least a page.
    alloc_len: usize,
}

// SAFETY: the buffer exclusively owns its allocation, which is addressable from
// any host thread (CU_MEM_ATTACH_GLOBAL); driver calls bind the owning context
// to the calling thread first. `&self` only gives shared access, `&mut self`
// exclusive access, like a `Box<[u8]>`.
unsafe impl Send for ManagedBuffer {}
// SAFETY: see the `Send` impl; no interior mutability is reachable through `&self`.
unsafe impl Sync for ManagedBuffer {}

impl ManagedBuffer {
    /// Allocates `len` bytes (rounded up to a host page) of zeroed managed
    /// memory on `ctx`'s device, after checking with `cuMemGetInfo` that the
    /// device keeps [`device_headroom`] bytes free afterwards.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, MemError> {
        let alloc_len = round_up_to_page(len.max(1)).ok_or(MemError::TooLarge {
            requested: u64::try_from(len).unwrap_or(u64::MAX),
            cap: u64::try_from(isize::MAX).unwrap_or(u64::MAX),
        })?;

        let _serial = MANAGED_ALLOC_LOCK
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ctx.bind_to_thread()?;
        if ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)? == 0 {
            return Err(MemError::Cuda(format!(
                "device {} does not support managed memory",
                ctx.ordinal()
            )));
        }
        let (free, total) = ctx.mem_get_info()?;
        check_device_headroom(to_u64(alloc_len), to_u64(free), to_u64(total))?;

        // SAFETY: the context is bound to this thread; the returned block is
        // owned by `buffer` below and freed exactly once in `Drop`.
        let dptr =
            unsafe { result::malloc_managed(alloc_len, CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }?;
        let buffer = ManagedBuffer {
            ctx: Arc::clone(ctx),
            dptr,
            len,
            alloc_len,
        };

        zero_on_private_stream(dptr, alloc_len)?;
        Ok(buffer)
    }

    /// Bytes requested at construction.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer was created with length zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes actually allocated (a host-page multiple, at least one page).
    pub fn capacity(&self) -> usize {
        self.alloc_len
    }

    /// The context that owns the allocation.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The address as a CUDA device pointer, for kernel arguments.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.dptr
    }

    /// The host address of the block (the same numeric address as
    /// [`device_ptr`](Self::device_ptr)).
    pub fn as_ptr(&self) -> *const u8 {
        self.base_ptr()
    }

    /// Mutable host address of the block.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.base_ptr()
    }

    pub(crate) fn base_ptr(&self) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(self.dptr as usize)
    }

    /// The `len()` bytes, read from the host.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: managed memory with CU_MEM_ATTACH_GLOBAL is host-accessible at
        // `dptr` for `alloc_len >= len` bytes, initialised (zeroed) in `new`, and
        // lives as long as `self`. Kernels writing it must not run concurrently
        // (documented on the type).
        unsafe { std::slice::from_raw_parts(self.base_ptr(), self.len) }
    }

    /// The `len()` bytes, writable from the host.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the host access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.base_ptr(), self.len) }
    }

    /// Asynchronously migrates the whole block to this buffer's device on
    /// `stream` (`cuMemPrefetchAsync_v2`).
    pub fn prefetch_to_device(&self, stream: &CudaStream) -> Result<(), MemError> {
        let location = self.device_location()?;
        self.prefetch(location, stream)
    }

    /// Asynchronously migrates the whole block to host memory on `stream`.
    pub fn prefetch_to_host(&self, stream: &CudaStream) -> Result<(), MemError> {
        self.prefetch(host_location(), stream)
    }

    /// Advises the driver to keep the pages on this buffer's device.
    pub fn advise_preferred_location_device(&self) -> Result<(), MemError> {
        let location = self.device_location()?;
        self.advise(CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, location)
    }

    /// Advises the driver to keep the pages in host memory.
    pub fn advise_preferred_location_host(&self) -> Result<(), MemError> {
        self.advise(
            CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            host_location(),
        )
    }

    /// Advises the driver that this buffer's device accesses the block, so it
    /// keeps a mapping there even while pages live elsewhere.
    pub fn advise_accessed_by_device(&self) -> Result<(), MemError> {
        let location = self.device_location()?;
        self.advise(CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY, location)
    }

    /// Advises the driver that the block is mostly read, so it may be
    /// duplicated on the processors that read it.
    pub fn advise_read_mostly(&self) -> Result<(), MemError> {
        // The location is ignored for this advice.
        let location = self.device_location()?;
        self.advise(CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY, location)
    }

    fn device_location(&self) -> Result<CUmemLocation, MemError> {
        let id = c_int::try_from(self.ctx.ordinal()).map_err(|_| {
            MemError::Cuda(format!("device ordinal {} too large", self.ctx.ordinal()))
        })?;
        Ok(CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id,
        })
    }

    fn prefetch(&self, location: CUmemLocation, stream: &CudaStream) -> Result<(), MemError> {
        stream.context().bind_to_thread()?;
        // SAFETY: `[dptr, dptr + alloc_len)` is exactly the managed block
        // allocated in `new`, alive while `self` is; `stream` is a live stream.
        unsafe {
            result::mem_prefetch_async(self.dptr, self.alloc_len, location, stream.cu_stream())
        }?;
        Ok(())
    }

    fn advise(&self, advice: CUmem_advise, location: CUmemLocation) -> Result<(), MemError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the range is exactly the managed block allocated in `new`;
        // advice changes placement hints only, never the contents.
        unsafe { result::mem_advise(self.dptr, self.alloc_len, advice, location) }?;
        Ok(())
    }
}

impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        if let Err(err) = self.ctx.bind_to_thread() {
            tracing::error!(%err, "cannot bind CUDA context to free managed memory; leaking it");
            return;
        }
        // SAFETY: `dptr` came from `cuMemAllocManaged` in `new` and is freed only
        // here; users must have finished kernels touching it (documented).
        if let Err(err) = unsafe { result::memory_free(self.dptr) } {
            tracing::error!(%err, bytes = self.alloc_len, "cuMemFree of managed memory failed");
        }
    }
}

/// Zeroes `[dptr, dptr + len)` on a private non-blocking stream and waits for it,
/// so that no host access can race the memset and no other tenant's work is
/// waited for. Raw driver calls keep cudarc's per-context stream bookkeeping
/// (which `CudaContext::new_stream` changes, with a context-wide sync on first
/// use) untouched.
fn zero_on_private_stream(dptr: CUdeviceptr, len: usize) -> Result<(), MemError> {
    struct OwnedStream(CUstream);
    impl Drop for OwnedStream {
        fn drop(&mut self) {
            // SAFETY: the stream was created below and is destroyed only here;
            // work still queued on it completes before its resources go.
            if let Err(err) = unsafe { result::stream::destroy(self.0) } {
                tracing::warn!(%err, "cuStreamDestroy failed");
            }
        }
    }
    let stream = OwnedStream(result::stream::create(
        result::stream::StreamKind::NonBlocking,
    )?);
    // SAFETY: the caller passes a block it just allocated and has not shared;
    // the stream is live until `stream` drops, after the synchronisation.
    unsafe {
        result::memset_d8_async(dptr, 0, len, stream.0)?;
        result::stream::synchronize(stream.0)?;
    }
    Ok(())
}

fn host_location() -> CUmemLocation {
    CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
        // Ignored for CU_MEM_LOCATION_TYPE_HOST.
        id: 0,
    }
}

fn to_u64(bytes: usize) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn headroom_is_the_larger_of_floor_and_percentage() {
        assert_eq!(device_headroom(0), MIN_DEVICE_HEADROOM_BYTES);
        assert_eq!(device_headroom(4 * GIB), MIN_DEVICE_HEADROOM_BYTES);
        assert_eq!(device_headroom(80 * GIB), 4 * GIB);
        assert_eq!(device_headroom(140 * GIB), 7 * GIB);
    }

    #[test]
    fn refuses_when_headroom_would_be_eaten() {
        let total = 80 * GIB;
        let free = 10 * GIB;
        // 6 GiB + 4 GiB headroom == 10 GiB free: allowed, one more byte is not.
        check_device_headroom(6 * GIB, free, total).unwrap();
        match check_device_headroom(6 * GIB + 1, free, total) {
            Err(MemError::InsufficientDeviceMemory { requested, free: f }) => {
                assert_eq!(requested, 6 * GIB + 1);
                assert_eq!(f, free);
            }
            other => panic!("expected refusal, got {other:?}"),
        }
        // Small cards fall back to the fixed floor.
        check_device_headroom(GIB, GIB + MIN_DEVICE_HEADROOM_BYTES, 2 * GIB).unwrap();
        assert!(check_device_headroom(GIB, GIB + MIN_DEVICE_HEADROOM_BYTES - 1, 2 * GIB).is_err());
        // Nothing fits when the device is already past its headroom.
        assert!(check_device_headroom(0, MIN_DEVICE_HEADROOM_BYTES - 1, GIB).is_err());
    }

    proptest::proptest! {
        #[test]
        fn accepted_requests_leave_the_headroom_free(
            requested in 0u64..(1 << 45),
            free in 0u64..(1 << 45),
            total in 0u64..(1 << 45),
        ) {
            let accepted = check_device_headroom(requested, free, total).is_ok();
            proptest::prop_assert_eq!(
                accepted,
                free >= requested && free - requested >= device_headroom(total)
            );
        }

        #[test]
        fn huge_values_never_overflow(requested: u64, free: u64, total: u64) {
            let _ = check_device_headroom(requested, free, total);
            proptest::prop_assert!(device_headroom(total) >= MIN_DEVICE_HEADROOM_BYTES);
        }
    }

    /// The device test below, run again as a child process whose `libcuda.so` is the
    /// stand-in driver (`tensor-wasm-cuda-standin`: host memory as managed memory).
    #[test]
    fn managed_buffer_on_the_stand_in_driver() {
        let dir = tempfile::tempdir().unwrap();
        tensor_wasm_cuda_standin::install(dir.path()).expect("the stand-in driver is built");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "managed::tests::managed_buffer_on_a_real_device",
            ])
            .env("LD_LIBRARY_PATH", dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Needs libcuda and a GPU: run with `cargo test -p tensor-wasm-mem -- --ignored`
    /// on a CUDA host. It fails (not skips) where there is no device.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn managed_buffer_on_a_real_device() {
        // SAFETY: only probes whether the driver library can be loaded.
        let present = unsafe { cudarc::driver::sys::is_culib_present() };
        assert!(present, "libcuda not present");
        let ctx = CudaContext::new(0).expect("a CUDA device");
        let mut buf = ManagedBuffer::new(&ctx, 3 << 20).unwrap();
        assert_eq!(buf.as_ptr() as usize % crate::host_page_size(), 0);
        assert!(buf.as_slice().iter().all(|b| *b == 0));
        buf.as_mut_slice()[12345] = 7;
        let stream = ctx.new_stream().unwrap();
        buf.advise_preferred_location_device().unwrap();
        buf.prefetch_to_device(&stream).unwrap();
        buf.prefetch_to_host(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(buf.as_slice()[12345], 7);

        let (free, _) = ctx.mem_get_info().unwrap();
        assert!(matches!(
            ManagedBuffer::new(&ctx, free),
            Err(MemError::InsufficientDeviceMemory { .. })
        ));
    }
}
