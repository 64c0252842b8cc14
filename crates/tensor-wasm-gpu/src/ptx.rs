//! The hand-written PTX of the builtin kernels (`src/ptx/*.ptx`), embedded in the binary.
//!
//! Each file declares `.version 8.0` and `.target sm_80`, so any driver from CUDA 12.0 on can
//! JIT it for Ampere, Hopper and later devices.

use crate::BuiltinKernel;

const VECTOR_ADD: &str = include_str!("ptx/vector_add.ptx");
const SCALE: &str = include_str!("ptx/scale.ptx");
const MATMUL: &str = include_str!("ptx/matmul.ptx");

impl BuiltinKernel {
    /// The PTX module of this builtin; its entry is named [`BuiltinKernel::descriptor`].
    pub fn ptx(&self) -> &'static str {
        match self {
            BuiltinKernel::VectorAdd => VECTOR_ADD,
            BuiltinKernel::Scale => SCALE,
            BuiltinKernel::Matmul => MATMUL,
        }
    }

    /// The file under `src/ptx/` holding [`BuiltinKernel::ptx`].
    pub fn ptx_file_name(&self) -> &'static str {
        match self {
            BuiltinKernel::VectorAdd => "vector_add.ptx",
            BuiltinKernel::Scale => "scale.ptx",
            BuiltinKernel::Matmul => "matmul.ptx",
        }
    }

    /// Sizes in bytes of the entry's parameters, in order (pointers are 8 bytes).
    pub(crate) fn param_sizes(&self) -> &'static [usize] {
        match self {
            BuiltinKernel::VectorAdd => &[8, 8, 8, 4],
            BuiltinKernel::Scale => &[8, 8, 4, 4],
            BuiltinKernel::Matmul => &[8, 8, 8, 4, 4, 4],
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// `(type, name)` of each `.param` of the entry `entry` in `ptx`.
    fn entry_params(ptx: &str, entry: &str) -> Vec<(String, String)> {
        let header = format!(".visible .entry {entry}(");
        let start = ptx.find(&header).expect("entry not found") + header.len();
        let end = start + ptx[start..].find(')').expect("unclosed parameter list");
        ptx[start..end]
            .split(',')
            .map(|param| {
                let words: Vec<&str> = param.split_whitespace().collect();
                assert_eq!(words.len(), 3, "unexpected parameter {param:?}");
                assert_eq!(words[0], ".param");
                (words[1].to_owned(), words[2].to_owned())
            })
            .collect()
    }

    #[test]
    fn ptx_headers_and_signatures_match_the_launch_code() {
        for kernel in BuiltinKernel::ALL {
            let ptx = kernel.ptx();
            assert!(
                ptx.contains(".version 8.0\n"),
                "{kernel}: PTX ISA must stay 8.0"
            );
            assert!(ptx.contains(".target sm_80\n"), "{kernel}");
            assert!(ptx.contains(".address_size 64\n"), "{kernel}");
            assert!(!ptx.contains('\0'));
            let sizes: Vec<usize> = entry_params(ptx, kernel.descriptor())
                .iter()
                .map(|(ty, _)| match ty.as_str() {
                    ".u64" => 8,
                    ".u32" | ".f32" => 4,
                    other => panic!("{kernel}: unexpected parameter type {other}"),
                })
                .collect();
            assert_eq!(sizes, kernel.param_sizes(), "{kernel}");
            // Floating-point arithmetic is only ever the explicitly rounded, never-fused forms.
            for line in ptx.lines().map(str::trim) {
                let op = line.split_whitespace().next().unwrap_or("");
                if op.ends_with(".f32") && (op.starts_with("add") || op.starts_with("mul")) {
                    assert!(op.contains(".rn."), "{kernel}: `{line}` may be contracted");
                }
                assert!(
                    !op.starts_with("fma") && !op.starts_with("mad.f"),
                    "{kernel}: `{line}`"
                );
            }
        }
    }

    pub(crate) fn workspace_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .expect("crate lives at <workspace>/crates/<name>")
            .to_path_buf()
    }

    /// The ptxas to check PTX with: `$TENSOR_WASM_PTXAS`, else `.tools/cuda/bin/ptxas` in the
    /// workspace (installed by `scripts/install-deps.sh`). Panics, saying how to get it, when
    /// there is none.
    pub(crate) fn ptxas() -> PathBuf {
        let ptxas = std::env::var_os("TENSOR_WASM_PTXAS")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join(".tools/cuda/bin/ptxas"));
        assert!(
            ptxas.is_file(),
            "ptxas not found at {}: run `scripts/install-deps.sh` (installs it from the PyPI \
             wheel nvidia-cuda-nvcc into .tools/cuda) or set TENSOR_WASM_PTXAS to a ptxas binary",
            ptxas.display()
        );
        ptxas
    }

    /// Assembles the PTX file `source` for `arch` (`sm_80`) with ptxas, warnings as errors,
    /// writing the cubin to `cubin`; panics with ptxas's output when it fails.
    pub(crate) fn assert_ptxas_assembles(source: &Path, arch: &str, cubin: &Path) {
        let ptxas = ptxas();
        let output = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg("--warning-as-error")
            .arg(source)
            .arg("-o")
            .arg(cubin)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas.display()));
        assert!(
            output.status.success(),
            "ptxas -arch={arch} {} failed ({}):\n{}{}",
            source.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let size = std::fs::metadata(cubin).map(|m| m.len()).unwrap_or(0);
        assert!(
            size > 0,
            "ptxas wrote no cubin for {} {arch}",
            source.display()
        );
    }

    /// Assembles PTX text for `sm_80` and `sm_90` (see [`assert_ptxas_assembles`]).
    pub(crate) fn assert_ptx_text_assembles(name: &str, ptx: &str) {
        let out_dir =
            std::env::temp_dir().join(format!("tensor-wasm-ptxas-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&out_dir).unwrap();
        let source = out_dir.join(format!("{name}.ptx"));
        std::fs::write(&source, ptx).unwrap();
        for arch in ["sm_80", "sm_90"] {
            assert_ptxas_assembles(&source, arch, &out_dir.join(format!("{name}.{arch}.cubin")));
        }
        let _ = std::fs::remove_dir_all(&out_dir);
    }

    #[test]
    fn ptx_assembles_with_ptxas() {
        let out_dir =
            std::env::temp_dir().join(format!("tensor-wasm-ptxas-{}", std::process::id()));
        std::fs::create_dir_all(&out_dir).unwrap();
        let ptx_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ptx");
        for kernel in BuiltinKernel::ALL {
            let source = ptx_dir.join(kernel.ptx_file_name());
            assert_eq!(std::fs::read_to_string(&source).unwrap(), kernel.ptx());
            for arch in ["sm_80", "sm_90"] {
                let cubin = out_dir.join(format!("{}.{arch}.cubin", kernel.descriptor()));
                assert_ptxas_assembles(&source, arch, &cubin);
            }
        }
        let _ = std::fs::remove_dir_all(&out_dir);
    }
}
