//! The CUDA backend's own tests (`#[ignore]`d: they need a CUDA driver) run on the stand-in
//! driver: this test runs the ignored tests of this test binary again as a child process
//! whose `libcuda.so` is `tensor-wasm-cuda-standin` (kernels in the PTX interpreter), and
//! prints how many driver calls they made. Further ignored tests here exercise the backend's
//! error paths on the stand-in: refused tenant code and arguments, and (one child process per
//! `TENSOR_WASM_STANDIN_FAULT` setting) a sticky fault reported at launch, event record or
//! synchronization.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output};

use crate::cuda::CudaBackend;
use crate::{launch, Backend, BuiltinKernel, GpuError, GpuIsolation, KernelArg, LaunchConfig};
use crate::{TenantKey, TenantLaneStats};

/// Runs this test binary's ignored tests whose names contain `filter` (all of them for `""`)
/// as a child process on the stand-in driver in `dir` (installed there unless a test put a
/// variant of it there first), with `settings` in its environment; panics unless they pass.
fn run_ignored_on_stand_in(dir: &Path, filter: &str, settings: &[(&str, &str)]) -> Output {
    if !dir.join("libcuda.so.1").exists() {
        tensor_wasm_cuda_standin::install(dir).expect("the stand-in driver is built");
    }
    // The stand-in first; NVRTC (when the caller's path has it) after.
    let mut library_path = OsString::from(dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        library_path.push(":");
        library_path.push(old);
    }
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--ignored", "--test-threads=1", "--show-output", filter])
        .env("LD_LIBRARY_PATH", library_path);
    for (name, value) in settings {
        child.env(name, value);
    }
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{settings:?}\n{stdout}\n{stderr}");
    out
}

#[test]
fn the_cuda_tests_pass_on_the_stand_in_driver() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let trace_setting = trace.to_str().unwrap();
    let out = run_ignored_on_stand_in(
        dir.path(),
        "",
        &[
            ("TENSOR_WASM_STANDIN_TRACE", trace_setting),
            // The stand-in's contexts cannot reach each other, so the test that faults one on
            // purpose may run beside the others.
            ("TENSOR_WASM_FAULT_TEST", "1"),
            // No step limit to speak of: a spinning kernel ends when it is cancelled, as on a
            // device (fenced_tenant_kernels_stay_inside_guest_memory_and_end_when_cancelled).
            ("TENSOR_WASM_STANDIN_STEP_LIMIT", "1099511627776"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let passed: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("test ")?.strip_suffix(" ... ok"))
        .collect();
    assert!(passed.len() >= 8, "{stdout}");
    let calls = std::fs::read_to_string(&trace).unwrap_or_default();
    // Written to stderr directly, past the test harness's capture, so that `make test`
    // says what the emulated CUDA path exercised.
    let _ = writeln!(
        std::io::stderr(),
        "stand-in: {} CUDA backend tests passed on the stand-in driver with {} driver calls: {}",
        passed.len(),
        calls.lines().count(),
        passed.join(", ")
    );
    for line in stdout
        .lines()
        .filter(|l| l.starts_with("a spinning fenced kernel"))
    {
        let _ = writeln!(std::io::stderr(), "stand-in: {line}");
    }
}

#[test]
fn a_sticky_fault_at_launch_event_record_or_sync_fails_that_launch_only() {
    for at in ["launch", "event-record", "sync"] {
        let dir = tempfile::tempdir().unwrap();
        let out = run_ignored_on_stand_in(
            dir.path(),
            "standin_a_sticky_fault_",
            &[("TENSOR_WASM_STANDIN_FAULT", at)],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("1 passed"), "{at}: {stdout}");
        assert!(!stdout.contains("skipped"), "{at}: {stdout}");
    }
}

/// Regression test: a driver that cannot describe its
/// errors (no `cuGetErrorString`: cudarc panics when it first calls a function the library
/// lacks) must not turn a failed launch into a panic that skips the failed launch's cleanup.
/// The failed launch still fails with the error's name, and the tenant's next launch runs on a
/// fresh context. Before `driver_error_text` caught that panic, the child process failed here.
#[test]
fn a_driver_without_error_strings_still_fails_one_launch_only() {
    let dir = tempfile::tempdir().unwrap();
    tensor_wasm_cuda_standin::install_without(dir.path(), &["cuGetErrorString"])
        .expect("the stand-in driver is built");
    let out = run_ignored_on_stand_in(
        dir.path(),
        "standin_a_sticky_fault_",
        &[("TENSOR_WASM_STANDIN_FAULT", "launch")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 passed"), "{stdout}");
    // The error text is the code's name alone: the driver had no description to give.
    assert!(
        stdout.contains("launch: CUDA error: CUDA_ERROR_ILLEGAL_ADDRESS during"),
        "{stdout}"
    );
}

/// Tenant PTX: `params(i32, i64, f64, u32, f32, u64)` does nothing; it takes one parameter
/// of each kind a launch passes.
const PARAMS_PTX: &str = "\
.version 8.0
.target sm_80
.address_size 64

.visible .entry params(
\t.param .s32 params_param_0,
\t.param .s64 params_param_1,
\t.param .f64 params_param_2,
\t.param .u32 params_param_3,
\t.param .f32 params_param_4,
\t.param .u64 params_param_5
)
{
\tret;
}
";

fn params_args() -> [KernelArg; 6] {
    [
        KernelArg::I32(-1),
        KernelArg::I64(-2),
        KernelArg::F64(0.5),
        KernelArg::U32(3),
        KernelArg::F32(1.5),
        KernelArg::U64(4),
    ]
}

/// A `tracing` subscriber that wants every event and formats its fields into nothing. With no
/// subscriber, `tracing` skips a log line's field expressions; with this one the backend's log
/// lines run, driver calls in their fields included.
struct EveryEvent;

impl tracing::Subscriber for EveryEvent {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Format;
        impl tracing::field::Visit for Format {
            fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                let _ = format!("{value:?}");
            }
        }
        event.record(&mut Format);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// A backend on the stand-in driver, or `None` (skipped) on any other driver. Installs
/// [`EveryEvent`] as this process's subscriber first.
fn stand_in_backend(isolation: GpuIsolation) -> Option<CudaBackend> {
    // Only the first call of the process installs it; later ones find it there.
    let _ = tracing::subscriber::set_global_default(EveryEvent);
    let backend = CudaBackend::open(0, isolation).expect("a CUDA driver");
    match backend.device() {
        crate::Device::Cuda(info) if info.name == tensor_wasm_cuda_standin::DEVICE_NAME => {
            Some(backend)
        }
        _ => {
            println!("skipped: runs on the stand-in driver only");
            None
        }
    }
}

#[test]
#[ignore = "needs the stand-in CUDA driver (the_cuda_tests_pass_on_the_stand_in_driver runs it)"]
fn standin_the_backend_refuses_bad_tenant_code_and_arguments() {
    let error = CudaBackend::open(99, GpuIsolation::StreamPerTenant).unwrap_err();
    assert!(matches!(error, GpuError::NotAvailable(_)), "{error:?}");
    let Some(gpu) = stand_in_backend(GpuIsolation::StreamPerTenant) else {
        return;
    };
    assert!(format!("{gpu:?}").starts_with("CudaBackend"));
    let (a, b) = (TenantKey::new("tn-a"), TenantKey::new("tn-b"));
    let invalid = |error: GpuError| assert!(matches!(error, GpuError::InvalidArgument(_)));
    invalid(gpu.load_ptx(&a, "\0", "params").unwrap_err());
    invalid(gpu.load_ptx(&a, PARAMS_PTX, "").unwrap_err());
    let error = gpu.load_ptx(&a, PARAMS_PTX, "missing").unwrap_err();
    assert!(matches!(error, GpuError::Cuda(_)), "{error:?}");

    // More parameters than a tenant kernel may have (4096; CUDA allows 32 764 bytes of them).
    let params: Vec<String> = (0..4097).map(|i| format!(".param .u8 p{i}")).collect();
    let many = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry many({})\n{{\n\tret;\n}}\n",
        params.join(", ")
    );
    invalid(gpu.load_ptx(&a, &many, "many").unwrap_err());

    let kernel = gpu.load_ptx(&a, PARAMS_PTX, "params").unwrap();
    assert!(
        format!("{kernel:?}").contains("[4, 8, 8, 4, 4, 8]"),
        "{kernel:?}"
    );
    let config = LaunchConfig::linear(1, 1);
    let args = params_args();
    let run = |tenant: &TenantKey, args: &[KernelArg]| {
        launch(&gpu, tenant, &kernel, &config, args, &mut [], |c| {
            c.wait_mut()
        })
    };
    // Every kind of scalar parameter reaches the driver.
    run(&a, &args).unwrap().unwrap();
    invalid(run(&a, &args[..5]).unwrap_err());
    // Tenant code runs for the tenant it was loaded for only, on the backend that loaded it.
    invalid(run(&b, &args).unwrap_err());
    let other = stand_in_backend(GpuIsolation::StreamPerTenant).unwrap();
    let error = launch(&other, &a, &kernel, &config, &args, &mut [], |_| ()).unwrap_err();
    invalid(error);

    // Guest memory the driver does not know (not managed memory) is refused before launch.
    let vector_add = gpu.load_builtin(BuiltinKernel::VectorAdd).unwrap();
    let mut plain = vec![0u8; 48];
    let buffer = |offset| KernelArg::Buffer { offset, len: 16 };
    let vector_args = [buffer(0), buffer(16), buffer(32), KernelArg::U32(4)];
    let error = launch(
        &gpu,
        &a,
        &vector_add,
        &config,
        &vector_args,
        &mut plain,
        |_| (),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("not memory the CUDA driver knows"),
        "{error:?}"
    );

    // A cubin (NVRTC's, when NVRTC loads) reaches the driver, which runs PTX only.
    let crate::Device::Cuda(info) = gpu.device() else {
        unreachable!("a CUDA backend")
    };
    let source = "extern \"C\" __global__ void nothing() {}";
    if let Ok(binary) = crate::compile_cuda(source, "nothing", info.compute_capability) {
        let error = gpu.load_cubin(&a, &binary.cubin, "nothing").unwrap_err();
        assert!(matches!(error, GpuError::Cuda(_)), "{error:?}");
    }
}

#[test]
#[ignore = "needs the stand-in CUDA driver with TENSOR_WASM_STANDIN_FAULT set (a_sticky_fault_at_launch_event_record_or_sync_fails_that_launch_only runs it)"]
fn standin_a_sticky_fault_gets_an_own_context_tenant_a_fresh_context() {
    let Ok(at) = std::env::var("TENSOR_WASM_STANDIN_FAULT") else {
        println!("skipped: needs TENSOR_WASM_STANDIN_FAULT");
        return;
    };
    let Some(gpu) = stand_in_backend(GpuIsolation::ContextPerTenant) else {
        return;
    };
    let tenant = TenantKey::new("tn-faulty");
    let kernel = gpu.load_ptx(&tenant, PARAMS_PTX, "params").unwrap();
    let config = LaunchConfig::linear(1, 1);
    let args = params_args();
    // The first launch faults: its submission fails, or (at sync) its completion does.
    let outcome = launch(&gpu, &tenant, &kernel, &config, &args, &mut [], |c| {
        c.wait_mut()
    });
    let error = match outcome {
        Ok(completion) => completion.unwrap_err(),
        Err(error) => error,
    };
    assert!(matches!(error, GpuError::Cuda(_)), "{at}: {error:?}");
    // The next use of the tenant's lane replaces the faulted context.
    let stats = |gpu: &CudaBackend| -> TenantLaneStats {
        gpu.tenant_lanes(GpuIsolation::ContextPerTenant).unwrap()
    };
    let created = stats(&gpu).created;
    let fresh = gpu.load_ptx(&tenant, PARAMS_PTX, "params").unwrap();
    assert_eq!(stats(&gpu).created, created + 1, "{at}");
    launch(&gpu, &tenant, &fresh, &config, &args, &mut [], |c| {
        c.wait_mut()
    })
    .unwrap()
    .unwrap();
    println!("{at}: {error}");
}

#[test]
#[ignore = "needs the stand-in CUDA driver (the_cuda_tests_pass_on_the_stand_in_driver runs it)"]
fn standin_raw_kernels_name_themselves_and_refuse_a_foreign_timer() {
    use crate::{LaunchTimer, RawCudaKernel};
    if stand_in_backend(GpuIsolation::StreamPerTenant).is_none() {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let kernel = RawCudaKernel::builtin(&ctx, BuiltinKernel::Scale).unwrap();
    assert_eq!(kernel.entry(), BuiltinKernel::Scale.descriptor());
    assert!(format!("{kernel:?}").contains("param_sizes"), "{kernel:?}");
    let other = cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
    let timer = LaunchTimer::new(&other).unwrap();
    assert!(format!("{timer:?}").starts_with("LaunchTimer"));
    let stream = ctx.new_stream().unwrap();
    let config = LaunchConfig::linear(1, 1);
    let error = kernel
        .launch_timed(&stream, &timer, &config, &[], &mut [])
        .unwrap_err();
    assert!(matches!(error, GpuError::InvalidArgument(_)), "{error:?}");
}

/// A program over [`PARAMS_PTX`] that declares its parameter count, as the JIT's blueprints do
/// (or, with `declared` other than 6, gets it wrong).
#[derive(Debug)]
struct CountedProgram {
    declared: usize,
}

impl crate::KernelProgram for CountedProgram {
    fn name(&self) -> &str {
        "counted"
    }

    fn fingerprint(&self) -> [u8; 16] {
        [self.declared as u8; 16]
    }

    fn validate(&self, _: &LaunchConfig, _: &[KernelArg], _: usize) -> Result<(), GpuError> {
        Ok(())
    }

    fn run_cpu(&self, _: &LaunchConfig, _: &[KernelArg], _: &mut [u8]) -> Result<(), GpuError> {
        Err(GpuError::NotAvailable("CUDA only".into()))
    }

    fn param_count(&self) -> Option<usize> {
        Some(self.declared)
    }

    fn ptx(&self, _: (u32, u32), _: i32) -> Result<(std::sync::Arc<str>, String), GpuError> {
        Ok((std::sync::Arc::from(PARAMS_PTX), "params".to_owned()))
    }
}

/// Regression test (the first GPU run, 2026-11-26: compute-sanitizer memcheck reported 75
/// `CUDA_ERROR_INVALID_VALUE` answers to `cuFuncGetParamInfo`, one per kernel loaded): the
/// backend found the end of every kernel's parameter list by asking for one past it. Kernels
/// whose PTX our code wrote (the builtins, programs with a `param_count`) now load without one
/// failing driver call; a program that declares the wrong count is refused.
#[test]
fn generated_kernels_load_without_a_failing_driver_call() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let out = run_ignored_on_stand_in(
        dir.path(),
        "standin_generated_kernels_load_",
        &[("TENSOR_WASM_STANDIN_TRACE", trace.to_str().unwrap())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 passed"), "{stdout}");
    let calls = std::fs::read_to_string(&trace).unwrap();
    let queries: Vec<&str> = calls
        .lines()
        .filter(|line| line.starts_with("cuFuncGetParamInfo "))
        .collect();
    // The builtins and the program (6 parameters) each read once, no index past the last; then
    // the program declaring 7: six answered, the seventh refused.
    let builtins: usize = BuiltinKernel::ALL
        .iter()
        .map(|k| k.param_sizes().len())
        .sum();
    assert_eq!(queries.len(), builtins + 6 + 7, "{queries:?}");
    let failed: Vec<usize> = (0..queries.len())
        .filter(|&i| !queries[i].ends_with(" 0"))
        .collect();
    assert_eq!(failed, [queries.len() - 1], "{queries:?}");
}

#[test]
#[ignore = "needs the stand-in CUDA driver (generated_kernels_load_without_a_failing_driver_call runs it)"]
fn standin_generated_kernels_load_and_run() {
    let Some(gpu) = stand_in_backend(GpuIsolation::StreamPerTenant) else {
        return;
    };
    let tenant = TenantKey::new("tn-counted");
    let kernel = gpu
        .load_program(&tenant, std::sync::Arc::new(CountedProgram { declared: 6 }))
        .unwrap();
    let config = LaunchConfig::linear(1, 1);
    launch(
        &gpu,
        &tenant,
        &kernel,
        &config,
        &params_args(),
        &mut [],
        |c| c.wait_mut(),
    )
    .unwrap()
    .unwrap();
    // A program that declares more parameters than its PTX has is refused (the one failing
    // call of this test: the driver refuses index 6).
    let error = gpu
        .load_program(&tenant, std::sync::Arc::new(CountedProgram { declared: 7 }))
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("declares 7 parameters, the driver found 6"),
        "{text}"
    );
}

/// `wild(p, offset, value)`: stores `value` at `p + offset`, any address at all.
const WILD_PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
    .visible .entry wild(.param .u64 p, .param .u64 offset, .param .u32 value)\n{\n\
    .reg .b32 %r<2>;\n.reg .b64 %rd<4>;\n\
    ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [offset]; ld.param.u32 %r1, [value];\n\
    add.u64 %rd3, %rd1, %rd2; st.global.u32 [%rd3], %r1;\nret;\n}\n";

/// `spin(p)`: loops until `*p` holds a value nothing writes.
const SPIN_PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
    .visible .entry spin(.param .u64 p)\n{\n.reg .pred %p<2>;\n.reg .b32 %r<2>;\n\
    .reg .b64 %rd<2>;\nld.param.u64 %rd1, [p];\n\
    LOOP: ld.volatile.global.u32 %r1, [%rd1]; setp.ne.u32 %p1, %r1, 12345; @%p1 bra LOOP;\n\
    ret;\n}\n";

/// Fenced tenant PTX on a CUDA device: the launch passes the guest memory as the window, so
/// a store far outside its buffer lands inside guest memory, once; text without the hidden
/// parameters is refused as fenced. A spinning fenced kernel ends once its launch is
/// cancelled: its polls read the cancel word the host sets while it runs.
#[test]
#[ignore = "needs a CUDA device (or the stand-in driver: the_cuda_tests_pass_on_the_stand_in_driver runs it)"]
fn fenced_tenant_kernels_stay_inside_guest_memory_and_end_when_cancelled() {
    use std::time::{Duration, Instant};

    let gpu = crate::open_backend(crate::DeviceChoice::Cuda).expect("a CUDA driver");
    let ctx = gpu.cuda_context().unwrap();
    let tenant = TenantKey::new("tn-fenced");
    let fenced = tensor_wasm_ptx_verify::fence(WILD_PTX).unwrap();
    let kernel = gpu.load_fenced_ptx(&tenant, &fenced.ptx, "wild").unwrap();
    let config = LaunchConfig::linear(1, 1);
    let marker = 0x0bad_f00d_u32;
    for offset in [1u64 << 20, u64::MAX - 3, 1 << 62, 70_000] {
        let mut memory = crate::tests::ManagedBuffer::new(ctx.clone(), 64 << 10);
        let args = [
            KernelArg::Buffer { offset: 0, len: 16 },
            KernelArg::U64(offset),
            KernelArg::U32(marker),
        ];
        launch(
            &*gpu,
            &tenant,
            &kernel,
            &config,
            &args,
            memory.bytes(),
            |c| c.wait_mut(),
        )
        .unwrap()
        .unwrap();
        let written = memory
            .bytes()
            .chunks_exact(4)
            .filter(|w| *w == marker.to_le_bytes())
            .count();
        assert_eq!(written, 1, "offset {offset:#x}");
    }
    let error = gpu.load_fenced_ptx(&tenant, WILD_PTX, "wild").unwrap_err();
    assert!(error.to_string().contains("not fenced"), "{error}");

    // The stand-in runs a stream's launches on a thread of its own and serves the cancel
    // word live, so the kernel sees the host's store while it runs, as on a GPU; its
    // interpreter is slower, so it gets fewer blocks to finish once they stop spinning.
    let on_stand_in = matches!(
        gpu.device(),
        crate::Device::Cuda(info) if info.name == tensor_wasm_cuda_standin::DEVICE_NAME
    );
    let fenced = tensor_wasm_ptx_verify::fence(SPIN_PTX).unwrap();
    let kernel = gpu.load_fenced_ptx(&tenant, &fenced.ptx, "spin").unwrap();
    let mut memory = crate::tests::ManagedBuffer::new(ctx, 4096);
    let args = [KernelArg::Buffer { offset: 0, len: 4 }];
    let blocks = if on_stand_in { 64 } else { 64 * 1024 };
    let config = LaunchConfig::linear(blocks, 256);
    let took = launch(
        &*gpu,
        &tenant,
        &kernel,
        &config,
        &args,
        memory.bytes(),
        |c| {
            std::thread::sleep(Duration::from_millis(200));
            assert!(!c.is_done(), "the kernel spins until it is cancelled");
            let cancelled = Instant::now();
            c.cancel();
            c.wait_mut().unwrap();
            cancelled.elapsed()
        },
    )
    .unwrap();
    println!("a spinning fenced kernel ended {took:?} after its cancel");
    assert!(took < Duration::from_secs(2), "{took:?}");
}
