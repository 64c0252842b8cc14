//! The stand-in driver through cudarc, as the product calls it. cudarc opens `libcuda.so` once
//! per process, so each check is an `#[ignore]`d test that a plain test runs again as a child
//! process with the stand-in on `LD_LIBRARY_PATH` (and the settings the check needs).

// cudarc's launches and raw allocations are `unsafe`; the tidy allow-list covers this crate.
#![allow(unsafe_code)]

use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

/// Runs the ignored test `name` of this binary as a child on the stand-in with `env`; returns
/// the trace lines.
fn on_stand_in(name: &str, env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    tensor_wasm_cuda_standin::install(dir.path()).expect("the stand-in driver is built");
    let trace = dir.path().join("trace");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--test-threads=1"])
        .env("LD_LIBRARY_PATH", dir.path())
        .env("TENSOR_WASM_STANDIN_TRACE", &trace)
        .env(CHILD, "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name}:\n{stdout}\n{stderr}"
    );
    read_trace(&trace)
}

/// Set for the child processes: the `child_` tests do nothing without it (run with
/// `--ignored` on a GPU host, they would talk to the real driver).
const CHILD: &str = "TENSOR_WASM_STANDIN_CHILD";

fn in_child() -> bool {
    let child = std::env::var_os(CHILD).is_some();
    if !child {
        println!("skipped: runs only as a child process on the stand-in driver");
    }
    child
}

fn read_trace(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

const STORE_PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry store(.param .u64 p_out, .param .u32 p_value)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p_out];
    ld.param.u32 %r1, [p_value];
    st.global.u32 [%rd1], %r1;
    ret;
}
"#;

fn context() -> Arc<CudaContext> {
    CudaContext::new(0).expect("the stand-in's device")
}

fn managed(bytes: usize) -> u64 {
    // SAFETY: a fresh allocation of `bytes` bytes; the tests free it or let the process end.
    unsafe { result::malloc_managed(bytes, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }.unwrap()
}

fn store(ctx: &Arc<CudaContext>, address: u64, value: u32) -> Result<(), DriverError> {
    let module = ctx.load_module(Ptx::from_src(STORE_PTX))?;
    let function = module.load_function("store")?;
    let stream = ctx.new_stream()?;
    let mut launch = stream.launch_builder(&function);
    launch.arg(&address).arg(&value);
    // SAFETY: the arguments match the kernel's two parameters; the stand-in checks the
    // address against its allocations.
    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
    stream.synchronize()
}

#[test]
#[ignore = "runs as a child process on the stand-in driver"]
fn child_launches_write_managed_memory() {
    if !in_child() {
        return;
    }
    let ctx = context();
    assert_eq!(ctx.name().unwrap(), tensor_wasm_cuda_standin::DEVICE_NAME);
    let address = managed(4096);
    store(&ctx, address + 8, 0xfeed).unwrap();
    // SAFETY: managed memory is host memory on the stand-in; 4096 bytes are allocated.
    let written = unsafe { std::ptr::read((address + 8) as *const u32) };
    assert_eq!(written, 0xfeed);
}

#[test]
fn launches_write_managed_memory() {
    let trace = on_stand_in("child_launches_write_managed_memory", &[]);
    assert!(
        trace.contains(&String::from("cuLaunchKernel 0")),
        "{trace:?}"
    );
    // Past the harness's capture, so that `make test` shows it.
    let _ = writeln!(
        std::io::stderr(),
        "stand-in: the driver test made {} driver calls",
        trace.len()
    );
}

#[test]
#[ignore = "runs as a child process on the stand-in driver"]
fn child_a_fault_is_sticky_in_its_context_only() {
    if !in_child() {
        return;
    }
    let ctx = context();
    let own = CudaContext::new_non_primary(0, 0).unwrap();
    let address = managed(4096);
    // Outside every allocation: the launch succeeds, the synchronization reports the fault.
    let error = store(&own, 8, 1).unwrap_err();
    assert_eq!(error.0, sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    // Sticky in that context ...
    assert_eq!(
        own.new_stream().unwrap_err().0,
        sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
    );
    // ... and not in the primary one.
    store(&ctx, address, 7).unwrap();
}

#[test]
fn a_fault_is_sticky_in_its_context_only() {
    let trace = on_stand_in("child_a_fault_is_sticky_in_its_context_only", &[]);
    assert!(
        trace.contains(&String::from("cuStreamSynchronize 700")),
        "{trace:?}"
    );
}

#[test]
#[ignore = "runs as a child process on the stand-in driver"]
fn child_modules_load_from_ptx_only() {
    if !in_child() {
        return;
    }
    let ctx = context();
    let error = |ptx: Ptx| ctx.load_module(ptx).unwrap_err().0;
    // A cubin (an ELF image).
    let elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0".to_vec();
    assert_eq!(
        error(Ptx::from_binary(elf)),
        sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
    );
    // PTX newer than a CUDA 13.0 driver reads.
    let newer = STORE_PTX.replace(".version 8.0", ".version 9.5");
    assert_eq!(
        error(Ptx::from_src(newer)),
        sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    );
    assert_eq!(
        error(Ptx::from_src("not ptx")),
        sys::CUresult::CUDA_ERROR_INVALID_PTX
    );
    let module = ctx.load_module(Ptx::from_src(STORE_PTX)).unwrap();
    assert_eq!(
        module.load_function("missing").unwrap_err().0,
        sys::CUresult::CUDA_ERROR_NOT_FOUND
    );
    let name = DriverError(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(
        name.error_name().unwrap().to_str().unwrap(),
        "CUDA_ERROR_ILLEGAL_ADDRESS"
    );
}

#[test]
fn modules_load_from_ptx_only() {
    on_stand_in("child_modules_load_from_ptx_only", &[]);
}

#[test]
#[ignore = "runs as a child process on the stand-in driver"]
fn child_injected_faults_are_reported_where_asked() {
    if !in_child() {
        return;
    }
    let ctx = context();
    let address = managed(4096);
    let at = std::env::var("TENSOR_WASM_STANDIN_FAULT").unwrap();
    let module = ctx.load_module(Ptx::from_src(STORE_PTX)).unwrap();
    let function = module.load_function("store").unwrap();
    let stream = ctx.new_stream().unwrap();
    let event = ctx.new_event(None).unwrap();
    let mut launch = stream.launch_builder(&function);
    launch.arg(&address).arg(&1u32);
    // SAFETY: as in `store`.
    let launched = unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }.map(drop);
    let recorded = launched.and_then(|()| event.record(&stream));
    let synced = recorded.and_then(|()| event.synchronize());
    let illegal = Err(DriverError(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
    assert_eq!(synced, illegal, "{at}");
    // Sticky from then on.
    assert_eq!(stream.synchronize(), illegal);
}

#[test]
fn injected_faults_are_reported_where_asked() {
    for (at, reported_by) in [
        ("launch", "cuLaunchKernel 700"),
        ("event-record", "cuEventRecord 700"),
        ("sync", "cuEventSynchronize 700"),
    ] {
        let trace = on_stand_in(
            "child_injected_faults_are_reported_where_asked",
            &[("TENSOR_WASM_STANDIN_FAULT", at)],
        );
        assert!(
            trace.iter().any(|line| line == reported_by),
            "{at}: {trace:?}"
        );
    }
}

#[test]
#[ignore = "runs as a child process on the stand-in driver"]
fn child_allocations_fail_when_asked() {
    if !in_child() {
        return;
    }
    context();
    // SAFETY: an allocation request; it fails.
    let error =
        unsafe { result::malloc_managed(4096, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }
            .unwrap_err();
    assert_eq!(error.0, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
}

#[test]
fn allocations_fail_when_asked() {
    on_stand_in(
        "child_allocations_fail_when_asked",
        &[("TENSOR_WASM_STANDIN_OOM", "1")],
    );
}

#[test]
#[ignore = "runs as a child process on the stand-in driver"]
fn child_every_module_load_fails_when_asked() {
    if !in_child() {
        return;
    }
    let ctx = context();
    assert_eq!(
        ctx.load_module(Ptx::from_src(STORE_PTX)).unwrap_err().0,
        sys::CUresult::CUDA_ERROR_INVALID_PTX
    );
}

#[test]
fn every_module_load_fails_when_asked() {
    on_stand_in(
        "child_every_module_load_fails_when_asked",
        &[("TENSOR_WASM_STANDIN_INVALID_PTX", "1")],
    );
}
