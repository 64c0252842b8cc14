//! Assembles every emitted kernel of the conformance set (`tensor_wasm_jit::conformance`) and
//! the check kernel of every math function (`tensor_wasm_jit::math`) with NVIDIA's `ptxas` (no
//! GPU needed) for sm_80 and sm_90.

use std::path::PathBuf;
use std::process::Command;

use tensor_wasm_jit::math::MathFunction;
use tensor_wasm_jit::{conformance, PtxTarget};

/// `$TENSOR_WASM_PTXAS`, or the copy `scripts/install-deps.sh` puts under `.tools/`.
fn ptxas() -> PathBuf {
    if let Some(path) = std::env::var_os("TENSOR_WASM_PTXAS") {
        return PathBuf::from(path);
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = workspace.join(".tools/cuda/bin/ptxas");
    assert!(
        path.exists(),
        "ptxas not found at {} (run scripts/install-deps.sh or set TENSOR_WASM_PTXAS)",
        path.display()
    );
    path
}

#[test]
fn every_emitted_kernel_assembles_with_ptxas() {
    let ptxas = ptxas();
    let dir = tempfile::tempdir().expect("tempdir");
    let targets = [
        PtxTarget::default(),
        PtxTarget::for_device((9, 0), 13000).expect("sm_90 under CUDA 13.0"),
        PtxTarget::for_device((9, 0), 12040).expect("sm_90 under CUDA 12.4"),
    ];
    let mut assembled = 0;
    let blueprints = conformance::blueprints();
    for blueprint in &blueprints {
        for target in &targets {
            let ptx = blueprint.emit_ptx(target);
            let name = format!("{}_{}", blueprint.entry_name(), target.sm_name());
            let source = dir.path().join(format!("{name}.ptx"));
            std::fs::write(&source, &ptx).expect("write PTX");
            let output = Command::new(&ptxas)
                .arg("--warning-as-error")
                .arg(format!("--gpu-name={}", target.sm_name()))
                .arg("--output-file")
                .arg(dir.path().join(format!("{name}.cubin")))
                .arg(&source)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas.display()));
            assert!(
                output.status.success(),
                "ptxas rejected {blueprint} for {target}:\n{}\n--- PTX ---\n{ptx}",
                String::from_utf8_lossy(&output.stderr)
            );
            assembled += 1;
        }
    }
    // Every blueprint of the conformance set (each example of every kind of the catalogue).
    assert!(blueprints.len() >= conformance::blueprint_kinds().len());
    assert_eq!(assembled, blueprints.len() * targets.len());
}

#[test]
fn every_math_check_kernel_assembles_with_ptxas() {
    let ptxas = ptxas();
    let dir = tempfile::tempdir().expect("tempdir");
    let targets = [
        PtxTarget::default(),
        PtxTarget::for_device((9, 0), 13000).expect("sm_90 under CUDA 13.0"),
        PtxTarget::for_device((9, 0), 12040).expect("sm_90 under CUDA 12.4"),
    ];
    for function in MathFunction::ALL {
        for target in &targets {
            let ptx = function.check_kernel(target);
            let name = format!("{}_{}", function.entry_name(), target.sm_name());
            let source = dir.path().join(format!("{name}.ptx"));
            std::fs::write(&source, &ptx).expect("write PTX");
            let output = Command::new(&ptxas)
                .arg("--warning-as-error")
                .arg(format!("--gpu-name={}", target.sm_name()))
                .arg("--output-file")
                .arg(dir.path().join(format!("{name}.cubin")))
                .arg(&source)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas.display()));
            assert!(
                output.status.success(),
                "ptxas rejected {name} for {target}:\n{}\n--- PTX ---\n{ptx}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
