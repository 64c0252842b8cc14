//! What a launch is made of: kernels, their arguments, launch configurations, and the `Backend`
//! trait that runs them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::{
    Completion, Device, GpuError, GpuIsolation, KernelProgram, TenantKey, TenantLaneStats,
};

/// One kernel argument, as a guest passes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
    /// A byte range of the guest's linear memory. The kernel receives its address.
    Buffer {
        offset: u64,
        len: u64,
    },
}

impl KernelArg {
    /// The bytes a kernel parameter holds for this argument, little-endian: a buffer as the
    /// device address `base + offset` (`base`: where guest memory byte 0 is), a scalar as
    /// its bits.
    pub fn param_bytes(&self, base: u64) -> Vec<u8> {
        match *self {
            KernelArg::Buffer { offset, .. } => base.wrapping_add(offset).to_le_bytes().to_vec(),
            KernelArg::U32(v) => v.to_le_bytes().to_vec(),
            KernelArg::I32(v) => v.to_le_bytes().to_vec(),
            KernelArg::F32(v) => v.to_bits().to_le_bytes().to_vec(),
            KernelArg::U64(v) => v.to_le_bytes().to_vec(),
            KernelArg::I64(v) => v.to_le_bytes().to_vec(),
            KernelArg::F64(v) => v.to_bits().to_le_bytes().to_vec(),
        }
    }

    /// The name of this argument's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            KernelArg::I32(_) => "i32",
            KernelArg::U32(_) => "u32",
            KernelArg::I64(_) => "i64",
            KernelArg::U64(_) => "u64",
            KernelArg::F32(_) => "f32",
            KernelArg::F64(_) => "f64",
            KernelArg::Buffer { .. } => "buffer",
        }
    }

    /// Size in bytes of the value the kernel receives (a buffer is a 64-bit address).
    pub fn param_size(&self) -> usize {
        match self {
            KernelArg::I32(_) | KernelArg::U32(_) | KernelArg::F32(_) => 4,
            KernelArg::I64(_) | KernelArg::U64(_) | KernelArg::F64(_) => 8,
            KernelArg::Buffer { .. } => 8,
        }
    }
}

/// Grid and block shape of a launch, in CUDA's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid (x, y, z).
    pub grid: [u32; 3],
    /// Threads in a block (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch with `block_size` threads per block and enough blocks to cover
    /// `elements` indices (at least one block).
    pub fn linear(elements: u32, block_size: u32) -> Self {
        let block_size = block_size.max(1);
        Self {
            grid: [elements.div_ceil(block_size).max(1), 1, 1],
            block: [block_size, 1, 1],
            shared_bytes: 0,
        }
    }

    /// A two-dimensional launch with `block` threads per block and enough blocks to cover
    /// `columns` (x) by `rows` (y) indices.
    pub fn grid_2d(columns: u32, rows: u32, block: [u32; 2]) -> Self {
        let [bx, by] = [block[0].max(1), block[1].max(1)];
        Self {
            grid: [columns.div_ceil(bx).max(1), rows.div_ceil(by).max(1), 1],
            block: [bx, by, 1],
            shared_bytes: 0,
        }
    }

    /// Threads covered along x: `grid.x * block.x`.
    pub fn threads_x(&self) -> u64 {
        u64::from(self.grid[0]) * u64::from(self.block[0])
    }

    /// Threads covered along y: `grid.y * block.y`.
    pub fn threads_y(&self) -> u64 {
        u64::from(self.grid[1]) * u64::from(self.block[1])
    }
}

/// The kernels every backend provides, with identical results on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinKernel {
    /// `vector_add(buffer a, buffer b, buffer out, u32 n)`: `out[x] = a[x] + b[x]` for `x < n`
    /// (f32).
    VectorAdd,
    /// `scale(buffer x, buffer out, f32 alpha, u32 n)`: `out[i] = alpha * x[i]` for `i < n`.
    Scale,
    /// `matmul(buffer a, buffer b, buffer c, u32 m, u32 n, u32 k)`: row-major f32,
    /// `c[row][col] = sum over p in 0..k of a[row][p] * b[p][col]`, summed in order of `p`, with
    /// `row` the y index and `col` the x index.
    Matmul,
}

impl BuiltinKernel {
    /// Every builtin kernel.
    pub const ALL: [BuiltinKernel; 3] = [
        BuiltinKernel::VectorAdd,
        BuiltinKernel::Scale,
        BuiltinKernel::Matmul,
    ];

    /// The builtin named by a guest's kernel descriptor (`"vector_add"`, `"scale"`, `"matmul"`).
    pub fn from_descriptor(descriptor: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kernel| kernel.descriptor() == descriptor)
    }

    /// The descriptor naming this builtin; also its PTX entry name.
    pub fn descriptor(&self) -> &'static str {
        match self {
            BuiltinKernel::VectorAdd => "vector_add",
            BuiltinKernel::Scale => "scale",
            BuiltinKernel::Matmul => "matmul",
        }
    }
}

impl fmt::Display for BuiltinKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.descriptor())
    }
}

/// A kernel ready to launch on the backend that loaded it: a builtin, a host-described
/// [`KernelProgram`], or a function loaded from tenant PTX or cubin (CUDA only). Cheap to clone.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) kind: KernelKind,
    /// What the kernel cache knows it by, when its loader said
    /// ([`Kernel::with_fingerprint`]).
    pub(crate) fingerprint: Option<[u8; 16]>,
}

#[derive(Clone)]
pub(crate) enum KernelKind {
    Builtin(BuiltinKernel),
    /// A function loaded from tenant PTX or cubin.
    Ptx(Arc<dyn LoadedFunction>),
    Program(Arc<ProgramKernel>),
}

/// A loaded [`KernelProgram`]: the program, and on CUDA the function loaded from its PTX.
pub(crate) struct ProgramKernel {
    pub(crate) program: Arc<dyn KernelProgram>,
    pub(crate) function: Option<Arc<dyn LoadedFunction>>,
}

/// A function a device backend loaded into its device (from tenant PTX or cubin, or from a
/// program's PTX), as a [`Kernel`] holds it. Its concrete type is the loading backend's own: that
/// backend gets it back by downcasting (the supertrait [`Any`]) when the kernel is launched.
pub(crate) trait LoadedFunction: Any + Send + Sync {
    /// The name of the function's entry point.
    fn entry(&self) -> &str;

    /// The size in bytes of each of the function's parameters, as the driver reports them.
    fn param_sizes(&self) -> &[usize];
}

impl dyn LoadedFunction {
    /// This function as the concrete type `T`, if that is what was loaded.
    pub(crate) fn downcast_ref<T: LoadedFunction>(&self) -> Option<&T> {
        (self as &dyn Any).downcast_ref()
    }
}

impl Kernel {
    pub(crate) fn builtin(kernel: BuiltinKernel) -> Self {
        Self {
            kind: KernelKind::Builtin(kernel),
            fingerprint: None,
        }
    }

    /// The builtin this kernel is, if it is one.
    pub fn as_builtin(&self) -> Option<BuiltinKernel> {
        match &self.kind {
            KernelKind::Builtin(kernel) => Some(*kernel),
            KernelKind::Ptx(_) | KernelKind::Program(_) => None,
        }
    }

    /// The host-described program this kernel runs, if it is one.
    pub fn as_program(&self) -> Option<&Arc<dyn KernelProgram>> {
        match &self.kind {
            KernelKind::Program(loaded) => Some(&loaded.program),
            KernelKind::Builtin(_) | KernelKind::Ptx(_) => None,
        }
    }

    /// The same kernel, known by `fingerprint` (the kernel cache's key of the
    /// tenant code it was loaded from): named so in its launches' trace spans.
    pub fn with_fingerprint(mut self, fingerprint: [u8; 16]) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// The fingerprint of the code the kernel runs: a program's own, or the
    /// one its loader gave; `None` for builtins and raw PTX.
    pub fn fingerprint(&self) -> Option<[u8; 16]> {
        match &self.kind {
            KernelKind::Program(loaded) => Some(loaded.program.fingerprint()),
            KernelKind::Builtin(_) | KernelKind::Ptx(_) => self.fingerprint,
        }
    }

    /// The kernel's name: the builtin descriptor, the program's name, or the PTX/cubin entry.
    pub fn name(&self) -> &str {
        match &self.kind {
            KernelKind::Builtin(kernel) => kernel.descriptor(),
            KernelKind::Ptx(function) => function.entry(),
            KernelKind::Program(loaded) => loaded.program.name(),
        }
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            KernelKind::Builtin(kernel) => f.debug_tuple("Kernel::Builtin").field(kernel).finish(),
            KernelKind::Ptx(function) => f
                .debug_struct("Kernel::Ptx")
                .field("entry", &function.entry())
                .field("param_sizes", &function.param_sizes())
                .finish(),
            KernelKind::Program(loaded) => f
                .debug_struct("Kernel::Program")
                .field("name", &loaded.program.name())
                .field("fingerprint", &loaded.program.fingerprint())
                .field("on_cuda", &loaded.function.is_some())
                .finish(),
        }
    }
}

/// A device that runs kernels over guest memory: the CPU worker pool or one CUDA device.
///
/// # Tenants
/// Every load of tenant code and every launch names the [`TenantKey`] it is for. A CUDA backend
/// runs each tenant's launches in that tenant's lane, at the [`GpuIsolation`] level the key
/// names ([`TenantKey::isolation`]) or, for a key naming none, the level the backend was opened
/// with: a stream of its own in the shared context, or a context of its own. Lanes of both
/// kinds coexist; they are created on a tenant's first use and at most
/// [`GpuIsolation::lane_capacity`] of each kind are kept (the least recently used is forgotten
/// first). Tenant PTX and cubin kernels belong to the tenant they were loaded for and
/// are refused for any other. Builtins and programs are the same code for everyone and may be
/// launched for any tenant; they run in the launching tenant's lane. The CPU backend has no
/// streams or contexts: the key picks the queue a launch waits in, and tenants take turns for
/// its workers.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The device this backend runs on.
    fn device(&self) -> &Device;

    /// Makes a builtin kernel ready to launch.
    ///
    /// # Errors
    /// Only when the backend failed to prepare it (not expected for a backend that opened).
    fn load_builtin(&self, kernel: BuiltinKernel) -> Result<Kernel, GpuError>;

    /// Loads the function `entry` from tenant PTX text, for `tenant`: on CUDA, into the tenant's
    /// lane (its context), creating the lane if needed. The kernel launches for `tenant` only.
    ///
    /// On a CUDA device a tenant kernel receives raw addresses and is not bounds-checked by
    /// this crate beyond its arguments; running unfenced tenant PTX there is a trust decision of
    /// the caller. The CPU backend runs it in the PTX interpreter, which checks every access
    /// against the guest memory (at most [`crate::MAX_TENANT_PTX_BYTES`] of text).
    ///
    /// # Errors
    /// `Cuda` when the driver rejects the PTX or finds no such entry, or the tenant's lane
    /// cannot be created; `InvalidArgument` for text with NUL bytes, and on the CPU backend for
    /// PTX the interpreter does not parse or accept.
    fn load_ptx(&self, tenant: &TenantKey, ptx: &str, entry: &str) -> Result<Kernel, GpuError>;

    /// Loads the function `entry` from tenant PTX that the fencing rewrite
    /// (`tensor-wasm-ptx-verify`) produced, for `tenant`: its entry ends with the rewrite's
    /// hidden parameters, which every launch fills in (the guest memory as its window, its
    /// dynamic shared memory, the launch's cancel word), so the kernel reaches no memory but
    /// the guest's and ends at its invocation's deadline. The CPU backend runs it in the PTX
    /// interpreter; a CUDA backend gives each launch a cancel word of its own in managed memory,
    /// which [`Completion::cancel`] sets.
    ///
    /// # Errors
    /// `InvalidArgument` for PTX the backend cannot load or whose entry lacks the hidden
    /// parameters; `NotAvailable` from a backend without fenced kernels (the default).
    fn load_fenced_ptx(
        &self,
        tenant: &TenantKey,
        ptx: &str,
        entry: &str,
    ) -> Result<Kernel, GpuError> {
        let _ = (tenant, ptx);
        Err(GpuError::NotAvailable(format!(
            "this backend does not run fenced tenant kernels (entry `{entry}`)"
        )))
    }

    /// Loads the function `entry` from a tenant cubin, for `tenant` (as [`Backend::load_ptx`]):
    /// an ELF image for this device's exact `sm_XX`, such as [`crate::compile_cuda`] returns.
    /// Tenant CUDA C++ is tenant code like tenant PTX: only the argument count and sizes are
    /// checked, and running it is a trust decision of the caller.
    ///
    /// The image is checked to be a CUDA ELF file whose headers and sections lie inside
    /// `cubin` before the driver sees it.
    ///
    /// # Errors
    /// `NotAvailable` on the CPU backend; `InvalidArgument` for bytes that are not a
    /// well-formed CUDA ELF image or an invalid entry name; `Cuda` when the driver rejects the
    /// image (for example a cubin built for another architecture) or finds no such entry.
    fn load_cubin(&self, tenant: &TenantKey, cubin: &[u8], entry: &str)
        -> Result<Kernel, GpuError>;

    /// Makes a host-described [`KernelProgram`] ready to launch, loading it for `tenant`.
    ///
    /// Loaded programs are cached by [`KernelProgram::fingerprint`], per CUDA context: loading a
    /// program whose fingerprint this backend already loaded (in the context `tenant` uses)
    /// returns the program loaded first (on CUDA without asking for PTX or loading a module
    /// again). A program kernel may be launched for any tenant: under
    /// [`GpuIsolation::ContextPerTenant`] it is loaded into each tenant's context on that
    /// tenant's first launch. The CPU backend runs [`KernelProgram::cpu_steps`] (or
    /// [`KernelProgram::run_cpu`]) on its worker pool; a CUDA backend loads [`KernelProgram::ptx`] for its device.
    ///
    /// # Errors
    /// On CUDA: what [`KernelProgram::ptx`] returns; `InvalidArgument` for PTX text with NUL
    /// bytes; `Cuda` when the driver rejects the PTX or finds no such entry, or the tenant's
    /// context cannot be created.
    fn load_program(
        &self,
        tenant: &TenantKey,
        program: Arc<dyn KernelProgram>,
    ) -> Result<Kernel, GpuError>;

    /// Validates and launches `kernel` for `tenant` over the guest memory `memory`; the
    /// returned Completion borrows `memory` until the kernel is done.
    ///
    /// On CUDA the launch goes to `tenant`'s lane (created on first use; see [`Backend`]). A
    /// tenant PTX or cubin kernel loaded for another tenant is refused (`InvalidArgument`).
    ///
    /// This is the unchecked building block: use the safe [`crate::launch`], which lends the
    /// completion to a closure and never lets it be leaked.
    ///
    /// Validation (the same on every backend): every buffer lies inside `memory`; builtins get
    /// the right number and types of arguments, buffers large enough for `n`/`m`/`k` and 4-byte
    /// aligned; programs pass [`KernelProgram::validate`]; grid and block dimensions are at
    /// least 1 and within CUDA's limits (at most 1024 threads per block, grid x below 2^31, grid
    /// y and z at most 65535, block z at most 64); at most 48 KiB of dynamic shared memory.
    ///
    /// Only the indices the launch grid covers are computed, on every backend.
    ///
    /// # Errors
    /// `InvalidArgument` for anything validation rejects (nothing is launched then);
    /// `NotAvailable` when the device cannot reach `memory`; `Cuda` for driver errors. When this
    /// returns an error, no kernel of this call is using `memory` any more.
    ///
    /// # Safety
    /// The kernel may still be reading and writing `memory` after this returns; only the
    /// returned [`Completion`] keeps `memory` borrowed until it is done, and only by being
    /// dropped (its drop blocks until the kernel has finished) or consumed by
    /// [`Completion::wait`]. The caller must not leak it: it must be dropped or waited on
    /// before `memory` is used again or freed. Leaking it (`std::mem::forget`,
    /// `ManuallyDrop`, `Box::leak`, an `Rc` cycle, a thread that never ends) ends the borrow
    /// while the kernel may still write into the memory, which is undefined behaviour.
    ///
    /// The duty travels with the completion: the caller must not exchange it for a completion
    /// it only borrows (`std::mem::swap` or `std::mem::replace` through a
    /// `&mut Completion`, such as the one [`crate::launch`] lends its closure) unless it then
    /// drops or waits on the completion it received in the same way.
    unsafe fn launch_unscoped<'m>(
        &self,
        tenant: &TenantKey,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &'m mut [u8],
    ) -> Result<Completion<'m>, GpuError>;

    /// The CUDA context of this backend, `None` on the CPU: the device's primary context, in
    /// which guest memory is allocated (CUDA managed memory, valid in every context of the
    /// device), whatever the isolation level.
    fn cuda_context(&self) -> Option<Arc<cudarc::driver::CudaContext>>;

    /// The isolation level this backend was opened with: the level of tenants whose
    /// [`TenantKey`] names none. The CPU backend reports it but has nothing to isolate: it has
    /// no streams or contexts.
    fn isolation(&self) -> GpuIsolation;

    /// The per-tenant lanes of a CUDA backend at `isolation` (how many, created, evicted: stream
    /// lanes and context lanes are kept and counted apart); `None` on the CPU.
    fn tenant_lanes(&self, isolation: GpuIsolation) -> Option<TenantLaneStats>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip() {
        for kernel in BuiltinKernel::ALL {
            assert_eq!(
                BuiltinKernel::from_descriptor(kernel.descriptor()),
                Some(kernel)
            );
        }
        assert_eq!(
            BuiltinKernel::from_descriptor("vector_add"),
            Some(BuiltinKernel::VectorAdd)
        );
        assert_eq!(
            BuiltinKernel::from_descriptor("scale"),
            Some(BuiltinKernel::Scale)
        );
        assert_eq!(
            BuiltinKernel::from_descriptor("matmul"),
            Some(BuiltinKernel::Matmul)
        );
        assert_eq!(BuiltinKernel::from_descriptor("Matmul"), None);
        assert_eq!(BuiltinKernel::from_descriptor(""), None);
    }

    /// A backend's loaded function, as a test stand-in.
    struct Loaded(&'static str);

    impl LoadedFunction for Loaded {
        fn entry(&self) -> &str {
            self.0
        }

        fn param_sizes(&self) -> &[usize] {
            &[8, 4]
        }
    }

    /// Another backend's loaded function.
    struct OtherLoaded;

    impl LoadedFunction for OtherLoaded {
        fn entry(&self) -> &str {
            "other"
        }

        fn param_sizes(&self) -> &[usize] {
            &[]
        }
    }

    #[test]
    fn a_loaded_function_is_found_again_by_its_own_type_only() {
        let loaded: Arc<dyn LoadedFunction> = Arc::new(Loaded("saxpy"));
        let kernel = Kernel {
            kind: KernelKind::Ptx(loaded.clone()),
            fingerprint: None,
        };
        assert_eq!(kernel.name(), "saxpy");
        let found = loaded.downcast_ref::<Loaded>().map(|loaded| loaded.0);
        assert_eq!(found, Some("saxpy"));
        assert!(loaded.downcast_ref::<OtherLoaded>().is_none());
        let other: Arc<dyn LoadedFunction> = Arc::new(OtherLoaded);
        assert!(other.downcast_ref::<Loaded>().is_none());
    }

    #[test]
    fn linear_config_covers_the_elements() {
        let config = LaunchConfig::linear(1000, 256);
        assert_eq!(config.grid, [4, 1, 1]);
        assert_eq!(config.block, [256, 1, 1]);
        assert!(config.threads_x() >= 1000);
        assert_eq!(LaunchConfig::linear(0, 0).grid, [1, 1, 1]);
        let config = LaunchConfig::grid_2d(33, 17, [16, 16]);
        assert_eq!(config.grid, [3, 2, 1]);
        assert_eq!(config.threads_y(), 32);
    }
}
