//! The host of `tensor-wasm:gpu@0.1.0` (`sdk/wit/gpu.wit`) for components: GPU buffers as
//! resources in device-visible memory the host owns, kernels from blueprints (and tenant PTX or
//! CUDA C++ with the `raw_ptx` capability), and launches validated and run exactly as the core
//! `wasi:cuda` ABI runs them ([`GpuShared::launch_on`]).
//!
//! An invocation's buffers live in one arena ([`Arena`]): CUDA managed memory when guest memory
//! is (UVM), host pages otherwise, reserved on the first `allocate` at the function's memory
//! limit and given back when the invocation ends. A launch passes the arena as the kernel's
//! memory and each buffer argument as its range in it, so buffers reach kernels without a copy
//! and chained kernels never round-trip through the guest. An invocation's live buffers share
//! its memory limit with its linear memories (`component_charge::MemoryBudget`): one
//! invocation never holds more than the limit in all. The API charges the limit to the
//! tenant's GPU-memory quota as it does for a core module on CUDA managed memory.

use std::sync::Arc;
use std::time::Instant;

use tensor_wasm_gpu::{Kernel, KernelArg, LaunchConfig, TenantKey};
use tensor_wasm_mem::{GuardedHostBuffer, ManagedBuffer, UnifiedBuffer};
use wasmtime::component::{HasSelf, Linker, Resource};

use crate::abi::{self, code, AbiError};
use crate::component::ComponentState;
use crate::guest_gpu::{Failure, GpuShared};
use crate::invocation_state::DeadlineExceeded;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../sdk/wit/gpu.wit",
        world: "guest",
        imports: { default: trappable },
        trappable_error_type: {
            "tensor-wasm:gpu/types.error" => super::GpuCallError,
        },
        with: {
            "tensor-wasm:gpu/buffers.buffer": super::GpuBuffer,
            "tensor-wasm:gpu/kernels.kernel": super::GpuKernel,
        },
    });
}

use bindings::tensor_wasm::gpu::{buffers, kernels, types};

/// Most buffers one invocation may hold at once.
pub(crate) const MAX_BUFFERS_PER_INVOCATION: usize = 4096;
/// Buffers start at multiples of this many bytes in the arena (a cache line and more; what
/// kernels expect of a device allocation's alignment).
const BUFFER_ALIGN: u64 = 256;

/// A buffer: its range in the invocation's arena.
#[derive(Debug)]
pub struct GpuBuffer {
    offset: u64,
    len: u64,
}

/// A kernel loaded for this invocation.
pub struct GpuKernel(Kernel);

/// Why a call failed: an error the guest gets, or a trap that ends the invocation (the
/// dispatcher saturated, the deadline passed in the call).
pub enum GpuCallError {
    Guest(types::Error),
    Trap(wasmtime::Error),
}

impl From<Failure> for GpuCallError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Abi(e) => GpuCallError::Guest(wit_error(e)),
            Failure::Saturated(e) => GpuCallError::Trap(wasmtime::Error::new(e)),
            Failure::Deadline => GpuCallError::Trap(wasmtime::Error::new(DeadlineExceeded)),
        }
    }
}

impl From<AbiError> for GpuCallError {
    fn from(e: AbiError) -> Self {
        GpuCallError::Guest(wit_error(e))
    }
}

impl From<wasmtime::component::ResourceTableError> for GpuCallError {
    fn from(e: wasmtime::component::ResourceTableError) -> Self {
        GpuCallError::Trap(wasmtime::Error::new(e))
    }
}

/// The WIT error for a core-ABI error code.
fn wit_error(e: AbiError) -> types::Error {
    match e.code {
        code::NOT_AVAILABLE => types::Error::NotAvailable(e.message),
        code::PERMISSION_DENIED => types::Error::PermissionDenied(e.message),
        code::LIMIT_EXCEEDED => types::Error::LimitExceeded(e.message),
        code::DEVICE_ERROR => types::Error::Device(e.message),
        _ => types::Error::InvalidArgument(e.message),
    }
}

/// The GPU state of one component invocation.
pub(crate) struct ComponentGpu {
    shared: Arc<GpuShared>,
    tenant: TenantKey,
    /// The function whose invocation this is (kernels and copies are accounted to it).
    function: Arc<str>,
    raw_ptx: bool,
    deadline: Instant,
    /// Whether the arena is to be CUDA managed memory (guest memory is).
    managed: bool,
    /// Most bytes the invocation's live buffers may take (its memory limit).
    capacity: u64,
    arena: Option<Arena>,
    /// The arena counted as device memory held (while it is reserved).
    held: Option<crate::accounting::DeviceHold>,
    kernels: usize,
}

impl ComponentGpu {
    pub(crate) fn new(
        shared: Arc<GpuShared>,
        tenant: &str,
        function: &str,
        raw_ptx: bool,
        deadline: Instant,
        managed: bool,
        capacity: u64,
    ) -> Self {
        ComponentGpu {
            tenant: shared.tenant_key(tenant),
            function: Arc::from(function),
            shared,
            raw_ptx,
            deadline,
            managed,
            capacity,
            arena: None,
            held: None,
            kernels: 0,
        }
    }

    fn arena(&mut self) -> Result<&mut Arena, GpuCallError> {
        if self.arena.is_none() {
            let len = usize::try_from(self.capacity).unwrap_or(usize::MAX);
            let memory = match self.shared.backend.cuda_context() {
                Some(ctx) if self.managed => {
                    ManagedBuffer::new(&ctx, len).map(UnifiedBuffer::Managed)
                }
                _ => GuardedHostBuffer::new(len, 0).map(UnifiedBuffer::Host),
            }
            .map_err(|e| {
                AbiError::new(
                    code::LIMIT_EXCEEDED,
                    format!("reserving {len} bytes of GPU buffer memory: {e}"),
                )
            })?;
            self.arena = Some(Arena::new(memory));
            let tenant = self.tenant.as_str();
            self.held = Some(
                self.shared
                    .accounts
                    .hold(tenant, &self.function, self.capacity),
            );
        }
        Ok(self.arena.as_mut().expect("reserved above"))
    }

    /// Counts `bytes` copied by the host into or out of the arena.
    fn moved(&self, what: crate::accounting::Moved, bytes: u64) {
        self.shared
            .accounts
            .moved(self.tenant.as_str(), &self.function, what, bytes);
    }
}

/// The memory an invocation's buffers live in, and which of it is free (first fit, neighbours
/// merged).
struct Arena {
    memory: UnifiedBuffer,
    /// Free ranges `(offset, len)`, sorted by offset, none adjacent.
    free: Vec<(u64, u64)>,
    live: usize,
}

impl Arena {
    fn new(memory: UnifiedBuffer) -> Self {
        let len = memory.len() as u64;
        Arena {
            memory,
            free: vec![(0, len)],
            live: 0,
        }
    }

    /// A zeroed range of `len` bytes (at least one), or `None` when none is free.
    fn take(&mut self, len: u64) -> Option<u64> {
        let size = len.max(1).checked_next_multiple_of(BUFFER_ALIGN)?;
        let at = self.free.iter().position(|&(_, free)| free >= size)?;
        let (offset, free) = self.free[at];
        if free == size {
            self.free.remove(at);
        } else {
            self.free[at] = (offset + size, free - size);
        }
        let range = offset as usize..(offset + len) as usize;
        self.memory.as_mut_slice()[range].fill(0);
        self.live += 1;
        Some(offset)
    }

    /// Gives back the range taken at `offset` for `len` bytes.
    fn give(&mut self, offset: u64, len: u64) {
        let size = len.max(1).next_multiple_of(BUFFER_ALIGN);
        let at = self.free.partition_point(|&(o, _)| o < offset);
        self.free.insert(at, (offset, size));
        if at + 1 < self.free.len() && self.free[at].0 + self.free[at].1 == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == self.free[at].0 {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
        self.live -= 1;
    }

    fn bytes(&mut self, offset: u64, len: u64) -> &mut [u8] {
        &mut self.memory.as_mut_slice()[offset as usize..(offset + len) as usize]
    }
}

/// The bytes a buffer of `len` takes of the memory budget: its range in the arena.
fn charged(len: u64) -> u64 {
    len.max(1).next_multiple_of(BUFFER_ALIGN)
}

/// Adds `tensor-wasm:gpu` to a component linker.
pub(crate) fn add_to_linker(linker: &mut Linker<ComponentState>) -> wasmtime::Result<()> {
    bindings::Guest::add_to_linker::<_, HasSelf<ComponentState>>(linker, |state| state)
}

impl ComponentState {
    fn gpu(&mut self) -> Result<&mut ComponentGpu, GpuCallError> {
        self.gpu.as_mut().ok_or_else(|| {
            GpuCallError::Guest(types::Error::NotAvailable(
                "this invocation has no GPU state".into(),
            ))
        })
    }
}

impl types::Host for ComponentState {
    fn convert_error(&mut self, err: GpuCallError) -> wasmtime::Result<types::Error> {
        match err {
            GpuCallError::Guest(e) => Ok(e),
            GpuCallError::Trap(e) => Err(e),
        }
    }
}

impl buffers::Host for ComponentState {}

impl buffers::HostBuffer for ComponentState {
    fn allocate(&mut self, len_bytes: u64) -> Result<Resource<GpuBuffer>, GpuCallError> {
        let gpu = self.gpu()?;
        let capacity = gpu.capacity;
        let arena = gpu.arena()?;
        if arena.live >= MAX_BUFFERS_PER_INVOCATION {
            return Err(AbiError::new(
                code::LIMIT_EXCEEDED,
                format!("an invocation may hold at most {MAX_BUFFERS_PER_INVOCATION} buffers"),
            )
            .into());
        }
        let offset = arena.take(len_bytes).ok_or_else(|| {
            AbiError::new(
                code::LIMIT_EXCEEDED,
                format!(
                    "no room for a buffer of {len_bytes} bytes: an invocation's buffers may take \
                     {capacity} bytes in all (the function's memory limit)"
                ),
            )
        })?;
        // Buffers share the memory limit with the component's linear memories.
        if let Err(message) = self.budget.take_gpu(charged(len_bytes)) {
            if let Some(arena) = self.gpu.as_mut().and_then(|gpu| gpu.arena.as_mut()) {
                arena.give(offset, len_bytes);
            }
            return Err(AbiError::new(code::LIMIT_EXCEEDED, message).into());
        }
        let buffer = GpuBuffer {
            offset,
            len: len_bytes,
        };
        match self.table.push(buffer) {
            Ok(resource) => Ok(resource),
            Err(e) => {
                self.budget.give_gpu(charged(len_bytes));
                if let Some(arena) = self.gpu.as_mut().and_then(|gpu| gpu.arena.as_mut()) {
                    arena.give(offset, len_bytes);
                }
                Err(e.into())
            }
        }
    }

    fn len(&mut self, buffer: Resource<GpuBuffer>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&buffer)?.len)
    }

    fn write(
        &mut self,
        buffer: Resource<GpuBuffer>,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<(), GpuCallError> {
        let (start, len) = self.range(&buffer, offset, data.len() as u64, "write")?;
        let gpu = self.gpu()?;
        gpu.moved(crate::accounting::Moved::ToDevice, data.len() as u64);
        gpu.arena()?.bytes(start, len).copy_from_slice(&data);
        Ok(())
    }

    fn read(
        &mut self,
        buffer: Resource<GpuBuffer>,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, GpuCallError> {
        let (start, len) = self.range(&buffer, offset, len, "read")?;
        let gpu = self.gpu()?;
        gpu.moved(crate::accounting::Moved::FromDevice, len);
        Ok(gpu.arena()?.bytes(start, len).to_vec())
    }

    fn drop(&mut self, buffer: Resource<GpuBuffer>) -> wasmtime::Result<()> {
        let buffer = self.table.delete(buffer)?;
        if let Some(arena) = self.gpu.as_mut().and_then(|gpu| gpu.arena.as_mut()) {
            arena.give(buffer.offset, buffer.len);
        }
        self.budget.give_gpu(charged(buffer.len));
        Ok(())
    }
}

impl ComponentState {
    /// The arena range of `len` bytes at `offset` in `buffer`, checked.
    fn range(
        &self,
        buffer: &Resource<GpuBuffer>,
        offset: u64,
        len: u64,
        what: &str,
    ) -> Result<(u64, u64), GpuCallError> {
        let buffer = self.table.get(buffer)?;
        let inside = offset.checked_add(len).is_some_and(|end| end <= buffer.len);
        if !inside {
            return Err(AbiError::new(
                code::INVALID_ARGUMENT,
                format!(
                    "{what} of {len} bytes at offset {offset}: the buffer has {} bytes",
                    buffer.len
                ),
            )
            .into());
        }
        Ok((buffer.offset + offset, len))
    }

    fn add_kernel(&mut self, kernel: Kernel) -> Result<Resource<GpuKernel>, GpuCallError> {
        let gpu = self.gpu()?;
        if gpu.kernels >= abi::MAX_KERNELS_PER_INSTANCE {
            return Err(AbiError::new(
                code::LIMIT_EXCEEDED,
                format!(
                    "an invocation may create at most {} kernels",
                    abi::MAX_KERNELS_PER_INSTANCE
                ),
            )
            .into());
        }
        gpu.kernels += 1;
        Ok(self.table.push(GpuKernel(kernel))?)
    }
}

/// Refuses text longer than the core ABI takes.
fn check_text(text: &str, what: &str) -> Result<(), AbiError> {
    if text.len() > abi::MAX_TEXT_BYTES as usize {
        return Err(AbiError::new(
            code::LIMIT_EXCEEDED,
            format!(
                "the {what} is {} bytes; the limit is {}",
                text.len(),
                abi::MAX_TEXT_BYTES
            ),
        ));
    }
    Ok(())
}

impl kernels::HostKernel for ComponentState {
    fn from_blueprint(&mut self, descriptor: String) -> Result<Resource<GpuKernel>, GpuCallError> {
        check_text(&descriptor, "descriptor")?;
        let gpu = self.gpu()?;
        let kernel = gpu
            .shared
            .blueprint_kernel(&gpu.tenant, descriptor.trim())?;
        self.add_kernel(kernel)
    }

    fn from_ptx(
        &mut self,
        ptx: String,
        entry: String,
    ) -> Result<Resource<GpuKernel>, GpuCallError> {
        check_text(&ptx, "PTX")?;
        check_text(&entry, "entry name")?;
        let gpu = self.gpu()?;
        let kernel =
            gpu.shared
                .tenant_ptx_kernel(&gpu.tenant, &ptx, &entry, gpu.raw_ptx, gpu.deadline)?;
        self.add_kernel(kernel)
    }

    fn from_cuda(
        &mut self,
        source: String,
        entry: String,
    ) -> Result<Resource<GpuKernel>, GpuCallError> {
        check_text(&source, "CUDA C++ source")?;
        check_text(&entry, "entry name")?;
        let gpu = self.gpu()?;
        let kernel =
            gpu.shared
                .cuda_kernel(&gpu.tenant, &source, &entry, gpu.raw_ptx, gpu.deadline)?;
        self.add_kernel(kernel)
    }

    fn drop(&mut self, kernel: Resource<GpuKernel>) -> wasmtime::Result<()> {
        self.table.delete(kernel)?;
        Ok(())
    }
}

impl kernels::Host for ComponentState {
    fn launch(
        &mut self,
        kernel: Resource<GpuKernel>,
        grid: kernels::Dim3,
        block: kernels::Dim3,
        shared_bytes: u32,
        args: Vec<kernels::Arg>,
    ) -> Result<(), GpuCallError> {
        if args.len() > abi::MAX_ARGS as usize {
            return Err(AbiError::new(
                code::LIMIT_EXCEEDED,
                format!("{} arguments; the limit is {}", args.len(), abi::MAX_ARGS),
            )
            .into());
        }
        let kernel = self.table.get(&kernel)?.0.clone();
        let args = args
            .iter()
            .map(|arg| {
                Ok(match arg {
                    kernels::Arg::I32(v) => KernelArg::I32(*v),
                    kernels::Arg::U32(v) => KernelArg::U32(*v),
                    kernels::Arg::I64(v) => KernelArg::I64(*v),
                    kernels::Arg::U64(v) => KernelArg::U64(*v),
                    kernels::Arg::F32(v) => KernelArg::F32(*v),
                    kernels::Arg::F64(v) => KernelArg::F64(*v),
                    kernels::Arg::Buffer(buffer) => {
                        let buffer = self.table.get(buffer)?;
                        KernelArg::Buffer {
                            offset: buffer.offset,
                            len: buffer.len,
                        }
                    }
                })
            })
            .collect::<Result<Vec<_>, GpuCallError>>()?;
        let config = LaunchConfig {
            grid: [grid.x, grid.y, grid.z],
            block: [block.x, block.y, block.z],
            shared_bytes,
        };
        let gpu = self.gpu()?;
        let (shared, tenant, deadline) = (gpu.shared.clone(), gpu.tenant.clone(), gpu.deadline);
        let function = gpu.function.clone();
        let memory = gpu.arena()?.memory.as_mut_slice();
        Ok(shared.launch_on(
            &tenant, &function, deadline, &kernel, &config, &args, memory,
        )?)
    }
}
