//! Tests of host-described kernel programs (with a small `negate` program: hand-written PTX and
//! a CPU loop), tenant cubin, and NVRTC; the CUDA ones are ignored unless asked for on a GPU
//! host (`cargo test -p tensor-wasm-gpu -- --ignored`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cpu::CpuBackend;
use crate::ptx::tests::{assert_ptx_text_assembles, workspace_root};
use crate::tests::{buffer, cpu, get_f32s, key, put_f32s, values, ManagedBuffer, SENTINEL};
use crate::validate::check_buffer;
use crate::{
    compile_cuda, launch, nvrtc_available, open_backend, open_backend_with, Backend, DeviceChoice,
    GpuError, GpuIsolation, KernelArg, KernelProgram, LaunchConfig, TenantKey,
};

/// `negate(buffer x, buffer out, u32 n)`: `out[i] = -x[i]` for `i < n` (f32).
const NEGATE_PTX: &str = "\
// tensor-wasm-gpu test program `negate`, hand-written PTX.
// negate(x, out: f32 pointers; n: u32): out[i] = -x[i] for i < n

.version 8.0
.target sm_80
.address_size 64

.visible .entry negate(
    .param .u64 negate_param_x,
    .param .u64 negate_param_out,
    .param .u32 negate_param_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<5>;
    .reg .b64   %rd<10>;
    .reg .f32   %f<3>;

    mov.u32         %r1, %ctaid.x;
    mov.u32         %r2, %ntid.x;
    mov.u32         %r3, %tid.x;
    mul.wide.u32    %rd1, %r1, %r2;
    cvt.u64.u32     %rd2, %r3;
    add.u64         %rd3, %rd1, %rd2;

    ld.param.u32    %r4, [negate_param_n];
    cvt.u64.u32     %rd4, %r4;
    setp.ge.u64     %p1, %rd3, %rd4;
    @%p1 bra        DONE;

    ld.param.u64    %rd5, [negate_param_x];
    ld.param.u64    %rd6, [negate_param_out];
    cvta.to.global.u64 %rd5, %rd5;
    cvta.to.global.u64 %rd6, %rd6;
    shl.b64         %rd7, %rd3, 2;
    add.u64         %rd8, %rd5, %rd7;
    add.u64         %rd9, %rd6, %rd7;
    ld.global.f32   %f1, [%rd8];
    neg.f32         %f2, %f1;
    st.global.f32   [%rd9], %f2;

DONE:
    ret;
}
";

/// The same kernel in CUDA C++, for NVRTC.
const NEGATE_CUDA: &str = r#"
extern "C" __global__ void negate(const float* x, float* out, unsigned int n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = -x[i];
    }
}
"#;

/// The test program: `negate` with a CPU loop, counting its PTX requests.
#[derive(Debug)]
struct NegateProgram {
    fingerprint: [u8; 16],
    ptx_requests: AtomicUsize,
    /// `run_cpu` fails with this instead of computing, to test error reporting.
    cpu_failure: Option<GpuError>,
    /// Offer the launch as this many parts (`CpuParts`) when not zero.
    parts: usize,
    /// The parts claim an output range that overlaps their input (must be refused).
    overlapping_parts: bool,
}

/// Elements `range` of `negate` as a part: `out[i] = -x[i]`, a few elements per step.
struct NegatePart {
    range: std::ops::Range<usize>,
    next: usize,
}

impl crate::CpuPart for NegatePart {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let x = inputs[0];
        let end = self.range.end.min(self.next + 3);
        for i in self.next..end {
            let value = f32::from_le_bytes(x[4 * i..4 * i + 4].try_into().unwrap());
            // The output slice starts at the part's first element.
            let at = 4 * (i - self.range.start);
            output[at..at + 4].copy_from_slice(&(-value).to_le_bytes());
        }
        self.next = end;
        Ok(end == self.range.end)
    }
}

impl NegateProgram {
    fn new(fingerprint: [u8; 16]) -> Self {
        Self {
            fingerprint,
            ptx_requests: AtomicUsize::new(0),
            cpu_failure: None,
            parts: 0,
            overlapping_parts: false,
        }
    }

    fn ptx_requests(&self) -> usize {
        self.ptx_requests.load(Ordering::SeqCst)
    }

    /// `(x, out, n)` as byte offsets, after the checks of `validate`.
    fn plan(args: &[KernelArg], memory_len: usize) -> Result<(usize, usize, u32), GpuError> {
        let invalid = |message: String| Err(GpuError::InvalidArgument(message));
        let [KernelArg::Buffer {
            offset: x,
            len: x_len,
        }, KernelArg::Buffer {
            offset: out,
            len: out_len,
        }, KernelArg::U32(n)] = *args
        else {
            return invalid(format!(
                "negate expects (buffer x, buffer out, u32 n), got {:?}",
                args.iter().map(KernelArg::type_name).collect::<Vec<_>>()
            ));
        };
        let x = check_buffer("negate x", x, x_len, memory_len)?;
        let out = check_buffer("negate out", out, out_len, memory_len)?;
        let needed = 4 * u64::from(n);
        for (name, range) in [("x", &x), ("out", &out)] {
            if range.start % 4 != 0 {
                return invalid(format!("negate {name}: offset not 4-byte aligned"));
            }
            if (range.len() as u64) < needed {
                return invalid(format!(
                    "negate {name}: {} bytes is too small for n = {n}",
                    range.len()
                ));
            }
        }
        Ok((x.start, out.start, n))
    }
}

impl KernelProgram for NegateProgram {
    fn name(&self) -> &str {
        "negate[f32]"
    }

    fn fingerprint(&self) -> [u8; 16] {
        self.fingerprint
    }

    fn validate(
        &self,
        _config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
    ) -> Result<(), GpuError> {
        Self::plan(args, memory_len).map(|_| ())
    }

    fn run_cpu(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), GpuError> {
        if let Some(failure) = &self.cpu_failure {
            return Err(failure.clone());
        }
        let (x, out, n) = Self::plan(args, memory.len())?;
        let covered = config.threads_x().min(u64::from(n)) as usize;
        for i in 0..covered {
            let at = x + 4 * i;
            let value = f32::from_le_bytes(memory[at..at + 4].try_into().unwrap());
            memory[out + 4 * i..out + 4 * i + 4].copy_from_slice(&(-value).to_le_bytes());
        }
        Ok(())
    }

    fn cpu_parts(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
        _workers: usize,
    ) -> Result<Option<crate::CpuParts>, GpuError> {
        if self.parts == 0 {
            return Ok(None);
        }
        let (x, out, n) = Self::plan(args, memory_len)?;
        let covered = config.threads_x().min(u64::from(n)) as usize;
        let per = covered.div_ceil(self.parts).max(1);
        let parts = (0..covered)
            .step_by(per)
            .map(|start| {
                let range = start..(start + per).min(covered);
                let output = if self.overlapping_parts {
                    x + 4 * range.start..x + 4 * range.end
                } else {
                    out + 4 * range.start..out + 4 * range.end
                };
                let next = range.start;
                let part: Box<dyn crate::CpuPart> = Box::new(NegatePart { range, next });
                (output, part)
            })
            .collect();
        Ok(Some(crate::CpuParts {
            inputs: std::iter::once(x..x + 4 * covered).collect(),
            parts,
        }))
    }

    fn ptx(
        &self,
        _compute_capability: (u32, u32),
        _driver_version: i32,
    ) -> Result<(Arc<str>, String), GpuError> {
        self.ptx_requests.fetch_add(1, Ordering::SeqCst);
        Ok((Arc::from(NEGATE_PTX), String::from("negate")))
    }
}

/// Guest memory with `x = values(seed, n)` at 0 and `out` (sentinels) right after it.
fn negate_memory(n: usize) -> (Vec<u8>, [KernelArg; 3]) {
    let mut memory = vec![0u8; 8 * n];
    put_f32s(&mut memory, 0, &values(7, n));
    put_f32s(&mut memory, 4 * n, &vec![SENTINEL; n]);
    let args = [
        buffer(0, 4 * n),
        buffer(4 * n, 4 * n),
        KernelArg::U32(n as u32),
    ];
    (memory, args)
}

/// `out` of [`negate_memory`] once `covered` elements are computed.
fn negated(n: usize, covered: usize) -> Vec<f32> {
    let x = values(7, n);
    (0..n)
        .map(|i| if i < covered { -x[i] } else { SENTINEL })
        .collect()
}

fn run_program(
    backend: &dyn Backend,
    program: Arc<dyn KernelProgram>,
    config: LaunchConfig,
    args: &[KernelArg],
    memory: &mut [u8],
) -> Result<(), GpuError> {
    let kernel = backend.load_program(&key(), program)?;
    launch(
        backend,
        &key(),
        &kernel,
        &config,
        args,
        memory,
        |completion| completion.wait_mut(),
    )?
}

#[test]
fn program_runs_on_the_cpu_through_the_scoped_launch() {
    let program: Arc<dyn KernelProgram> = Arc::new(NegateProgram::new([1; 16]));
    let backend = CpuBackend::with_workers(3).unwrap();
    for parts in [0, 1, 3, 7] {
        let program: Arc<dyn KernelProgram> = Arc::new(NegateProgram {
            parts,
            ..NegateProgram::new([20 + parts as u8; 16])
        });
        for (n, config) in [
            (1000, LaunchConfig::linear(1000, 256)),
            (1000, LaunchConfig::linear(300, 100)),
            (1, LaunchConfig::linear(1, 1)),
        ] {
            let (mut memory, args) = negate_memory(n);
            run_program(&backend, program.clone(), config, &args, &mut memory).unwrap();
            let covered = (config.threads_x() as usize).min(n);
            assert_eq!(
                get_f32s(&memory, 4 * n, n),
                negated(n, covered),
                "{config:?} in {parts} parts"
            );
        }
    }
    let kernel = cpu().load_program(&key(), program.clone()).unwrap();
    assert_eq!(kernel.name(), "negate[f32]");
    assert!(kernel.as_builtin().is_none());
    assert!(format!("{kernel:?}").contains("negate[f32]"));
}

/// Parts whose output overlaps what they read are refused before anything runs.
#[test]
fn parts_that_could_race_are_refused() {
    let program = Arc::new(NegateProgram {
        parts: 2,
        overlapping_parts: true,
        ..NegateProgram::new([30; 16])
    });
    let (mut memory, args) = negate_memory(64);
    let before = memory.clone();
    let result = run_program(
        cpu(),
        program,
        LaunchConfig::linear(64, 64),
        &args,
        &mut memory,
    );
    assert!(
        matches!(&result, Err(GpuError::Cuda(m)) if m.contains("parts refused")),
        "{result:?}"
    );
    assert_eq!(memory, before, "nothing ran");
}

#[test]
fn program_errors_from_the_cpu_run_end_the_completion() {
    let failure = GpuError::Cuda(String::from("negate exploded"));
    let program = Arc::new(NegateProgram {
        cpu_failure: Some(failure.clone()),
        ..NegateProgram::new([2; 16])
    });
    let (mut memory, args) = negate_memory(8);
    let result = run_program(
        cpu(),
        program,
        LaunchConfig::linear(8, 8),
        &args,
        &mut memory,
    );
    assert_eq!(result, Err(failure));
}

#[test]
fn program_validation_refuses_bad_launches_before_running() {
    let program: Arc<dyn KernelProgram> = Arc::new(NegateProgram::new([3; 16]));
    let kernel = cpu().load_program(&key(), program).unwrap();
    let n = 16;
    let (memory, good) = negate_memory(n);
    let config = LaunchConfig::linear(n as u32, 32);
    let cases: Vec<(Vec<KernelArg>, LaunchConfig, &str)> = vec![
        // The generic buffer check, before the program sees anything.
        (
            vec![good[0], buffer(4 * n, 4 * n + 4), good[2]],
            config,
            "ends beyond guest memory",
        ),
        (
            vec![
                KernelArg::Buffer {
                    offset: u64::MAX,
                    len: 2,
                },
                good[1],
                good[2],
            ],
            config,
            "overflows",
        ),
        // The launch limits.
        (
            good.to_vec(),
            LaunchConfig {
                block: [2048, 1, 1],
                ..config
            },
            "threads per block",
        ),
        // The program's own rules.
        (good[..2].to_vec(), config, "negate expects"),
        (
            vec![good[0], good[1], KernelArg::U32(n as u32 + 1)],
            config,
            "too small",
        ),
        (
            vec![good[0], buffer(4 * n - 2, 8), KernelArg::U32(2)],
            config,
            "aligned",
        ),
    ];
    for (args, config, expected) in cases {
        let mut copy = memory.clone();
        let mut called = false;
        let error = launch(cpu(), &key(), &kernel, &config, &args, &mut copy, |_| {
            called = true
        })
        .unwrap_err();
        assert!(
            matches!(&error, GpuError::InvalidArgument(m) if m.contains(expected)),
            "{args:?}: expected {expected:?}, got {error:?}"
        );
        assert!(!called);
        assert_eq!(copy, memory, "nothing ran");
    }
}

#[test]
fn loading_a_program_twice_reuses_the_cache() {
    let backend = CpuBackend::with_workers(2).unwrap();
    let first = Arc::new(NegateProgram::new([4; 16]));
    let kernel = backend.load_program(&key(), first.clone()).unwrap();
    let again = backend.load_program(&key(), first.clone()).unwrap();
    // Another instance with the same fingerprint is the same kernel.
    let twin = backend
        .load_program(&key(), Arc::new(NegateProgram::new([4; 16])))
        .unwrap();
    assert_eq!(backend.program_loads(), 1);
    let first: Arc<dyn KernelProgram> = first;
    for loaded in [&kernel, &again, &twin] {
        assert!(Arc::ptr_eq(loaded.as_program().unwrap(), &first));
    }
    backend
        .load_program(&key(), Arc::new(NegateProgram::new([5; 16])))
        .unwrap();
    assert_eq!(backend.program_loads(), 2);
}

#[test]
fn cpu_backend_refuses_cubin() {
    let error = cpu().load_cubin(&key(), b"\x7fELF", "negate").unwrap_err();
    assert!(
        matches!(&error, GpuError::NotAvailable(m) if m.contains("needs a CUDA device")),
        "{error:?}"
    );
}

#[test]
fn test_program_ptx_assembles_with_ptxas() {
    let program = NegateProgram::new([6; 16]);
    let (ptx, entry) = program.ptx((8, 0), 13000).unwrap();
    assert_eq!(entry, "negate");
    assert_eq!(program.ptx_requests(), 1);
    assert_ptx_text_assembles("negate", &ptx);
}

// ---------------------------------------------------------------------------------------------
// NVRTC

/// The env var that lets a host without NVRTC skip the NVRTC tests.
const SKIP_NVRTC: &str = "TENSOR_WASM_SKIP_NVRTC";

/// The directory of the NVRTC libraries `scripts/install-deps.sh` installs.
fn workspace_nvrtc_dir() -> PathBuf {
    workspace_root().join(".tools/nvrtc/nvidia/cu13/lib")
}

/// Makes sure NVRTC loads in this test process: from the loader's path (`make unit` puts the
/// workspace's copy on `LD_LIBRARY_PATH`), else by loading the workspace's copy by its path (so
/// that a plain `cargo test` finds it too: cudarc's later load by bare name then finds the
/// library already loaded under its soname). Returns `false` only when the NVRTC tests are
/// skipped on purpose; panics, saying how to fix it, when NVRTC cannot be loaded.
fn require_nvrtc() -> bool {
    if nvrtc_available().is_ok() {
        return true;
    }
    let fallback = workspace_nvrtc_dir();
    // The builtins library first: NVRTC loads it by bare name when it compiles.
    for library in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let path = fallback.join(library);
        if !path.is_file() {
            continue;
        }
        let path = std::ffi::CString::new(path.to_string_lossy().into_owned()).unwrap();
        // SAFETY: loads a shared library by absolute path; its initialisers are NVIDIA's NVRTC
        // ones, which only set up the library. The handle is never closed, so the library stays
        // loaded for the rest of the test process.
        let _handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    }
    match nvrtc_available() {
        Ok(()) => true,
        Err(_) if std::env::var(SKIP_NVRTC).as_deref() == Ok("1") => {
            eprintln!("NVRTC tests skipped: {SKIP_NVRTC}=1");
            false
        }
        Err(reason) => panic!(
            "NVRTC cannot be loaded: {reason}. Run `scripts/install-deps.sh` (installs it into \
             {}) and run the tests with `make unit` (which puts that directory on \
             LD_LIBRARY_PATH), or set {SKIP_NVRTC}=1 to skip the NVRTC tests on a host without \
             NVRTC",
            fallback.display()
        ),
    }
}

/// The PTX ISA version a PTX text declares (`.version 9.0` is (9, 0)).
fn ptx_isa_version(ptx: &str) -> (u32, u32) {
    let version = ptx
        .lines()
        .find_map(|line| line.trim().strip_prefix(".version "))
        .expect("PTX declares .version");
    let (major, minor) = version.trim().split_once('.').expect("major.minor");
    (major.parse().unwrap(), minor.parse().unwrap())
}

#[test]
fn nvrtc_compiles_cuda_cpp_to_ptx_and_cubin_without_a_gpu() {
    if !require_nvrtc() {
        return;
    }
    let version = crate::nvrtc_version().unwrap();
    assert_eq!(
        version,
        (13, 0),
        "NVRTC must be 13.0 like the driver of the GPU machines (newer PTX does not load there)"
    );
    for arch in [(8, 0), (9, 0)] {
        let binary = compile_cuda(NEGATE_CUDA, "negate", arch).unwrap();
        let sm = format!("sm_{}{}", arch.0, arch.1);
        assert!(
            binary.ptx.contains(".entry negate("),
            "{sm}:\n{}",
            binary.ptx
        );
        assert!(
            binary.ptx.contains(&format!(".target {sm}")),
            "{sm}:\n{}",
            binary.ptx
        );
        // CUDA 13.0 drivers load PTX ISA 9.0 and older only.
        assert!(ptx_isa_version(&binary.ptx) <= (9, 0), "{sm}");
        assert!(binary.cubin.starts_with(b"\x7fELF"), "{sm}");
        crate::cubin::check_cubin(&binary.cubin).unwrap();
        assert!(!binary.log.contains("error"), "{}", binary.log);
    }

    let error = compile_cuda(
        "extern \"C\" __global__ void broken(float* x) { x[0] = ; }",
        "broken",
        (9, 0),
    )
    .unwrap_err();
    match &error {
        GpuError::Compile { log } => {
            assert!(log.contains("error"), "{log}");
            assert!(log.contains("tenant.cu"), "{log}");
        }
        other => panic!("expected Compile, got {other:?}"),
    }
    assert!(error.to_string().contains("compilation failed"));

    // A kernel without extern "C" has a mangled name.
    let mangled = "__global__ void negate(float* x) { x[0] = -x[0]; }";
    let error = compile_cuda(mangled, "negate", (9, 0)).unwrap_err();
    assert!(
        matches!(&error, GpuError::Compile { log } if log.contains("extern \"C\"")),
        "{error:?}"
    );
    let error = compile_cuda(NEGATE_CUDA, "missing", (9, 0)).unwrap_err();
    assert!(
        matches!(&error, GpuError::Compile { log } if log.contains("no kernel entry `missing`")),
        "{error:?}"
    );

    // An architecture NVRTC does not know.
    let error = compile_cuda(NEGATE_CUDA, "negate", (1, 0)).unwrap_err();
    assert!(
        matches!(&error, GpuError::InvalidArgument(m) if m.contains("sm_10")),
        "{error:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// CUDA (GPU hosts only)

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_programs_and_cubins_match_the_cpu() {
    let gpu = open_backend(DeviceChoice::Cuda).expect("this test needs a CUDA device");
    let ctx = gpu.cuda_context().unwrap();
    let crate::Device::Cuda(info) = gpu.device().clone() else {
        panic!("not a CUDA device");
    };

    // A program, loaded twice (two instances, one fingerprint): its PTX is loaded once.
    let program = Arc::new(NegateProgram::new([9; 16]));
    let kernel = gpu.load_program(&key(), program.clone()).unwrap();
    let twin = gpu
        .load_program(&key(), Arc::new(NegateProgram::new([9; 16])))
        .unwrap();
    assert_eq!(program.ptx_requests(), 1);
    let program_dyn: Arc<dyn KernelProgram> = program.clone();
    assert!(Arc::ptr_eq(twin.as_program().unwrap(), &program_dyn));
    drop(twin);

    let n = 100_003;
    for config in [
        LaunchConfig::linear(n as u32, 256),
        LaunchConfig::linear(50_000, 128),
    ] {
        let (host, args) = negate_memory(n);
        let mut guest = ManagedBuffer::new(ctx.clone(), host.len());
        let memory = guest.bytes();
        memory.copy_from_slice(&host);
        launch(
            &*gpu,
            &key(),
            &kernel,
            &config,
            &args,
            memory,
            |completion| completion.wait_mut(),
        )
        .unwrap()
        .unwrap();
        let covered = (config.threads_x() as usize).min(n);
        assert_eq!(get_f32s(memory, 4 * n, n), negated(n, covered));
        // Out of bounds is refused here too.
        let bad = [args[0], buffer(4 * n, 4 * n + 4), args[2]];
        let error = launch(&*gpu, &key(), &kernel, &config, &bad, memory, |_| ()).unwrap_err();
        assert!(matches!(error, GpuError::InvalidArgument(_)), "{error:?}");
    }

    // The same kernel compiled by NVRTC for this device, loaded as a tenant cubin.
    if !require_nvrtc() {
        return;
    }
    if info.name == tensor_wasm_cuda_standin::DEVICE_NAME {
        // The stand-in driver runs PTX only: a cubin is CUDA_ERROR_NOT_SUPPORTED there.
        return;
    }
    let binary = compile_cuda(NEGATE_CUDA, "negate", info.compute_capability).unwrap();
    let tenant = gpu.load_cubin(&key(), &binary.cubin, "negate").unwrap();
    let (host, args) = negate_memory(n);
    let mut guest = ManagedBuffer::new(ctx.clone(), host.len());
    let memory = guest.bytes();
    memory.copy_from_slice(&host);
    let config = LaunchConfig::linear(n as u32, 256);
    launch(
        &*gpu,
        &key(),
        &tenant,
        &config,
        &args,
        memory,
        |completion| completion.wait_mut(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(get_f32s(memory, 4 * n, n), negated(n, n));
    // Its PTX loads as tenant PTX as well.
    gpu.load_ptx(&key(), &binary.ptx, "negate").unwrap();
    assert!(matches!(
        gpu.load_cubin(&key(), b"not a cubin", "negate"),
        Err(GpuError::InvalidArgument(_))
    ));
    assert!(matches!(
        gpu.load_cubin(&key(), &binary.cubin, "missing"),
        Err(GpuError::Cuda(_))
    ));
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_programs_run_for_every_tenant_in_its_own_lane() {
    let n = 50_001;
    for isolation in [
        GpuIsolation::StreamPerTenant,
        GpuIsolation::ContextPerTenant,
    ] {
        let gpu = open_backend_with(DeviceChoice::Cuda, isolation)
            .expect("this test needs a CUDA device");
        let ctx = gpu.cuda_context().unwrap();
        let program = Arc::new(NegateProgram::new([11; 16]));
        let (a, b) = (TenantKey::new("tn-a"), TenantKey::new("tn-b"));
        // Loaded once, for `a`; launched for both (in `b`'s own context under
        // ContextPerTenant, where it is loaded on `b`'s first launch).
        let kernel = gpu.load_program(&a, program.clone()).unwrap();
        for tenant in [&a, &b, &b, &a] {
            let (host, args) = negate_memory(n);
            let mut guest = ManagedBuffer::new(ctx.clone(), host.len());
            let memory = guest.bytes();
            memory.copy_from_slice(&host);
            let config = LaunchConfig::linear(n as u32, 256);
            launch(&*gpu, tenant, &kernel, &config, &args, memory, |c| {
                c.wait_mut()
            })
            .unwrap()
            .unwrap();
            assert_eq!(
                get_f32s(memory, 4 * n, n),
                negated(n, n),
                "{isolation} {tenant:?}"
            );
        }
        // One PTX request per context the program was loaded in.
        let contexts = match isolation {
            GpuIsolation::StreamPerTenant => 1,
            GpuIsolation::ContextPerTenant => 2,
        };
        assert_eq!(program.ptx_requests(), contexts, "{isolation}");
        // Loading it again for `b` finds it in `b`'s context.
        gpu.load_program(&b, program.clone()).unwrap();
        assert_eq!(program.ptx_requests(), contexts, "{isolation}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_programs_run_for_stream_and_context_tenants_of_one_backend() {
    let n = 50_001;
    let gpu = open_backend_with(DeviceChoice::Cuda, GpuIsolation::StreamPerTenant)
        .expect("this test needs a CUDA device");
    let ctx = gpu.cuda_context().unwrap();
    let program = Arc::new(NegateProgram::new([12; 16]));
    let stream = TenantKey::new("tn-stream");
    let context = TenantKey::new("tn-context").with_isolation(GpuIsolation::ContextPerTenant);
    // Loaded for the context tenant (into its context), launched for both: the stream tenant's
    // launches load it into the shared context on first use.
    let kernel = gpu.load_program(&context, program.clone()).unwrap();
    for tenant in [&context, &stream, &stream, &context] {
        let (host, args) = negate_memory(n);
        let mut guest = ManagedBuffer::new(ctx.clone(), host.len());
        let memory = guest.bytes();
        memory.copy_from_slice(&host);
        let config = LaunchConfig::linear(n as u32, 256);
        launch(&*gpu, tenant, &kernel, &config, &args, memory, |c| {
            c.wait_mut()
        })
        .unwrap()
        .unwrap();
        assert_eq!(get_f32s(memory, 4 * n, n), negated(n, n), "{tenant:?}");
    }
    // Once in the tenant's context, once in the shared one.
    assert_eq!(program.ptx_requests(), 2);
    let lanes = |level| gpu.tenant_lanes(level).unwrap().live;
    assert_eq!(
        (
            lanes(GpuIsolation::StreamPerTenant),
            lanes(GpuIsolation::ContextPerTenant)
        ),
        (1, 1)
    );
}

/// A program whose CPU run never ends: each step takes a millisecond and leaves work to do.
#[derive(Debug)]
struct EndlessProgram {
    steps: Arc<AtomicUsize>,
    /// Offer the launch as this many parts when not zero (part `i` writes byte `i`).
    parts: usize,
}

struct EndlessSteps(Arc<AtomicUsize>);

impl crate::CpuPart for EndlessSteps {
    fn step(&mut self, _: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        crate::CpuSteps::step(self, output)
    }
}

impl crate::CpuSteps for EndlessSteps {
    fn step(&mut self, memory: &mut [u8]) -> Result<bool, GpuError> {
        std::thread::sleep(std::time::Duration::from_millis(1));
        memory[0] = memory[0].wrapping_add(1);
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(false)
    }
}

impl KernelProgram for EndlessProgram {
    fn name(&self) -> &str {
        "endless"
    }

    fn fingerprint(&self) -> [u8; 16] {
        [9; 16]
    }

    fn validate(&self, _: &LaunchConfig, _: &[KernelArg], len: usize) -> Result<(), GpuError> {
        if len == 0 {
            return Err(GpuError::InvalidArgument(String::from("no memory")));
        }
        Ok(())
    }

    fn run_cpu(&self, _: &LaunchConfig, _: &[KernelArg], _: &mut [u8]) -> Result<(), GpuError> {
        Err(GpuError::Cuda(String::from(
            "the CPU backend must run the steps",
        )))
    }

    fn cpu_steps(
        &self,
        _: &LaunchConfig,
        _: &[KernelArg],
        _: usize,
    ) -> Result<Option<Box<dyn crate::CpuSteps>>, GpuError> {
        Ok(Some(Box::new(EndlessSteps(self.steps.clone()))))
    }

    fn cpu_parts(
        &self,
        _: &LaunchConfig,
        _: &[KernelArg],
        _: usize,
        _: usize,
    ) -> Result<Option<crate::CpuParts>, GpuError> {
        if self.parts == 0 {
            return Ok(None);
        }
        let parts = (0..self.parts)
            .map(|i| {
                let part: Box<dyn crate::CpuPart> = Box::new(EndlessSteps(self.steps.clone()));
                (i..i + 1, part)
            })
            .collect();
        Ok(Some(crate::CpuParts {
            inputs: Vec::new(),
            parts,
        }))
    }

    fn ptx(&self, _: (u32, u32), _: i32) -> Result<(Arc<str>, String), GpuError> {
        Err(GpuError::NotAvailable(String::from("CPU only")))
    }
}

/// A program with steps, or with parts, is cancelled between two steps, and while it runs on
/// the only worker, another tenant's launch gets the worker between its slices instead of
/// waiting for it to end (never, here).
#[test]
fn a_stepped_program_is_cancellable_and_shares_the_pool() {
    for parts in [0, 3] {
        stepped_program_is_cancellable_and_shares_the_pool(parts);
    }
}

fn stepped_program_is_cancellable_and_shares_the_pool(parts: usize) {
    use std::time::{Duration, Instant};

    let backend = CpuBackend::with_workers(1).unwrap();
    let steps = Arc::new(AtomicUsize::new(0));
    let endless = backend
        .load_program(
            &TenantKey::new("tn-endless"),
            Arc::new(EndlessProgram {
                steps: steps.clone(),
                parts,
            }),
        )
        .unwrap();
    let negate = backend
        .load_program(&key(), Arc::new(NegateProgram::new([10; 16])))
        .unwrap();
    let mut endless_memory = vec![0u8; 64];
    let mut small_memory = vec![0u8; 64];
    put_f32s(&mut small_memory, 0, &[1.5, -2.0]);
    let small_args = [buffer(0, 8), buffer(32, 8), KernelArg::U32(2)];
    let outcome = launch(
        &backend,
        &TenantKey::new("tn-endless"),
        &endless,
        &LaunchConfig::linear(1, 1),
        &[],
        &mut endless_memory,
        |running| {
            let start = Instant::now();
            while steps.load(Ordering::SeqCst) < 3 {
                assert!(start.elapsed() < Duration::from_secs(10), "no step ran");
                std::thread::yield_now();
            }
            let small = launch(
                &backend,
                &key(),
                &negate,
                &LaunchConfig::linear(1, 256),
                &small_args,
                &mut small_memory,
                |small| {
                    let start = Instant::now();
                    (small.wait_mut(), start.elapsed())
                },
            )
            .unwrap();
            let start = Instant::now();
            running.cancel();
            (small, running.wait_mut(), start.elapsed())
        },
    )
    .unwrap();
    let ((small, small_took), endless, stopping) = outcome;
    small.unwrap();
    assert!(
        small_took < Duration::from_secs(2),
        "the small launch waited {small_took:?} behind the endless one"
    );
    assert_eq!(get_f32s(&small_memory, 32, 2), [-1.5, 2.0]);
    assert!(
        matches!(endless, Err(GpuError::Cancelled(_))),
        "{endless:?}"
    );
    assert!(
        stopping < Duration::from_secs(1),
        "stopping took {stopping:?}"
    );
    assert!(endless_memory[0] > 0, "the steps wrote guest memory");
}
