//! Assembles every emitted kernel with NVIDIA's `ptxas` (no GPU needed) for sm_80 and sm_90.

use std::path::PathBuf;
use std::process::Command;

use tensor_wasm_jit::{Blueprint, PtxTarget};

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

/// Every blueprint kind with several parameter choices, in both data types where defined.
fn blueprints() -> Vec<Blueprint> {
    let mut kernels = vec![
        "elementwise[add]",
        "elementwise[sub]",
        "elementwise[mul]",
        "elementwise[div]",
        "elementwise[max]",
        "elementwise[min]",
        "elementwise[relu]",
        "elementwise[scale]",
        "elementwise[fma]",
        "vector_add[1]",
        "vector_add[2]",
        "vector_add[4]",
        "vector_add[8]",
        "vector_add[16]",
        "reduce[sum]",
        "reduce[max]",
        "matmul[16x16x16]",
        "matmul[32x32x8]",
        "matmul[8x32x4]",
        "matmul[1x1x1]",
        "matmul[64x16x64]",
        "conv2d[3x3]",
        "conv2d[3x3,s2,p1]",
        "conv2d[1x1]",
        "conv2d[5x7,s3,p4]",
        "conv2d[11x11,s8,p10]",
    ];
    kernels.sort_unstable();
    let mut blueprints = Vec::new();
    for kernel in kernels {
        for dtype in ["f32", "i32"] {
            match Blueprint::parse(&format!("{kernel}:{dtype}")) {
                Ok(blueprint) => blueprints.push(blueprint),
                Err(error) => assert_eq!(kernel, "elementwise[div]", "{error}"),
            }
        }
    }
    blueprints
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
    for blueprint in blueprints() {
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
    assert_eq!(assembled, 51 * targets.len());
}
