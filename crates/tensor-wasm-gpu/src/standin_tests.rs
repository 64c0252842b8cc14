//! The CUDA backend's own tests (`#[ignore]`d: they need a CUDA driver) run on the stand-in
//! driver: this test runs the ignored tests of this test binary again as a child process
//! whose `libcuda.so` is `tensor-wasm-cuda-standin` (kernels in the PTX interpreter), and
//! prints how many driver calls they made.

use std::ffi::OsString;
use std::process::Command;

#[test]
fn the_cuda_tests_pass_on_the_stand_in_driver() {
    let dir = tempfile::tempdir().unwrap();
    tensor_wasm_cuda_standin::install(dir.path()).expect("the stand-in driver is built");
    let trace = dir.path().join("trace");
    // The stand-in first; NVRTC (when the caller's path has it) after.
    let mut library_path = OsString::from(dir.path());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        library_path.push(":");
        library_path.push(old);
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", library_path)
        .env("TENSOR_WASM_STANDIN_TRACE", &trace)
        // The stand-in's contexts cannot reach each other, so the test that faults one on
        // purpose may run beside the others.
        .env("TENSOR_WASM_FAULT_TEST", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let passed: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("test ")?.strip_suffix(" ... ok"))
        .collect();
    assert!(passed.len() >= 8, "{stdout}");
    let calls = std::fs::read_to_string(&trace).unwrap_or_default();
    eprintln!(
        "{} CUDA backend tests passed on the stand-in driver with {} driver calls: {}",
        passed.len(),
        calls.lines().count(),
        passed.join(", ")
    );
}
