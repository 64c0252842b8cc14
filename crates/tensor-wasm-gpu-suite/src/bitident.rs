//! `bit-identity`: every kernel of the conformance set (`tensor_wasm_jit::conformance`: every
//! blueprint kind × dtype and every builtin on their fixed cases, the CUDA C++ test kernels)
//! launched on this backend, the whole guest memory afterwards (canary gaps included) compared
//! with what the CPU backend left in it on the build machine.
//!
//! `make gpu-suite` records that memory (`--record DIR`: `bit-identity.json` lists the cases
//! with the digest of their inputs, `bit-identity.bin` holds the expected memories one after
//! another); the artifact carries the record, and the GPU run (`--expected DIR`) rebuilds each
//! case from the shared list, checks that its inputs are the recorded ones, launches it and
//! compares. Kernels we generate (blueprints, builtins) must match bit for bit (NaN payloads
//! aside); each difference of a tenant-style CUDA C++ kernel is listed.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tensor_wasm_gpu::{
    compile_cuda, launch, open_backend, Backend, BuiltinKernel, DeviceChoice, Kernel, KernelArg,
    LaunchConfig, TenantKey,
};
use tensor_wasm_jit::conformance::{
    blueprints, build, build_builtin, builtin_fixed_cases, cuda_cases, first_difference,
    fixed_cases, Layout, BUILTIN_FIXED_CASES, FIXED_CASES,
};
use tensor_wasm_jit::{CompiledBlueprint, Dtype};

use crate::common::{cuda_info, Memory, Section, Suite};

/// The record's file names, in the directory `--record` and `--expected` name.
const INDEX: &str = "bit-identity.json";
const DATA: &str = "bit-identity.bin";

/// Who wrote a kernel: our emitter or hand-written PTX (must match), or tenant-style CUDA C++.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Blueprint,
    Builtin,
    CudaCpp,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Blueprint => "blueprint",
            Origin::Builtin => "builtin",
            Origin::CudaCpp => "cuda-c++",
        }
    }
}

/// One launch of the set.
struct Case {
    name: String,
    origin: Origin,
    /// The blueprint descriptor, builtin descriptor or CUDA entry point.
    kernel: String,
    dtype: Dtype,
    config: LaunchConfig,
    args: Vec<KernelArg>,
    layout: Layout,
    /// CUDA C++ only: the kernel's source and its reference memory.
    cuda: Option<(&'static str, Vec<u8>)>,
}

/// Every case of the set, in a fixed order.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for blueprint in blueprints() {
        for (index, case) in fixed_cases(&blueprint, FIXED_CASES).iter().enumerate() {
            let (config, args, layout) = build(&blueprint, case);
            out.push(Case {
                name: format!("{blueprint}#{index}"),
                origin: Origin::Blueprint,
                kernel: blueprint.descriptor(),
                dtype: blueprint.dtype(),
                config,
                args,
                layout,
                cuda: None,
            });
        }
    }
    for kernel in BuiltinKernel::ALL {
        for (index, case) in builtin_fixed_cases(kernel, BUILTIN_FIXED_CASES)
            .iter()
            .enumerate()
        {
            let (config, args, layout) = build_builtin(kernel, case);
            out.push(Case {
                name: format!("builtin:{}#{index}", kernel.descriptor()),
                origin: Origin::Builtin,
                kernel: kernel.descriptor().to_owned(),
                dtype: Dtype::F32,
                config,
                args,
                layout,
                cuda: None,
            });
        }
    }
    for case in cuda_cases() {
        out.push(Case {
            name: format!("cuda:{}", case.kernel.entry),
            origin: Origin::CudaCpp,
            kernel: case.kernel.entry.to_owned(),
            dtype: case.dtype,
            config: case.config,
            args: case.args,
            layout: case.layout,
            cuda: Some((case.kernel.source, case.expected)),
        });
    }
    out
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Loads the kernels of the set on `backend`, once each (CUDA C++ through NVRTC for this
/// device: an error string where that is not possible).
struct Kernels<'a> {
    backend: &'a dyn Backend,
    tenant: TenantKey,
    loaded: std::collections::HashMap<String, Result<Kernel, String>>,
}

impl<'a> Kernels<'a> {
    fn new(backend: &'a dyn Backend) -> Self {
        Kernels {
            backend,
            tenant: TenantKey::new("gpu-suite-bit-identity"),
            loaded: Default::default(),
        }
    }

    fn get(&mut self, case: &Case) -> Result<&Kernel, String> {
        let backend = self.backend;
        let tenant = &self.tenant;
        self.loaded
            .entry(case.kernel.clone())
            .or_insert_with(|| match case.origin {
                Origin::Blueprint => CompiledBlueprint::parse(&case.kernel)
                    .map_err(|e| e.to_string())
                    .and_then(|program| {
                        backend
                            .load_program(tenant, Arc::new(program))
                            .map_err(|e| e.to_string())
                    }),
                Origin::Builtin => BuiltinKernel::from_descriptor(&case.kernel)
                    .ok_or_else(|| format!("no builtin {}", case.kernel))
                    .and_then(|b| backend.load_builtin(b).map_err(|e| e.to_string())),
                Origin::CudaCpp => {
                    let Some(info) = cuda_info(backend) else {
                        return Err("CUDA C++ needs a CUDA device".to_owned());
                    };
                    let source = case.cuda.as_ref().expect("a CUDA case has its source").0;
                    compile_cuda(source, &case.kernel, info.compute_capability)
                        .map_err(|e| format!("NVRTC: {e}"))
                        .and_then(|binary| {
                            backend
                                .load_ptx(tenant, &binary.ptx, &case.kernel)
                                .map_err(|e| e.to_string())
                        })
                }
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The memory after `case`'s launch on the backend.
    fn run(&mut self, case: &Case) -> Result<Vec<u8>, String> {
        let backend = self.backend;
        let kernel = self.get(case)?.clone();
        let mut memory =
            Memory::new(backend, case.layout.memory.len()).map_err(|e| format!("{e:#}"))?;
        memory.bytes().copy_from_slice(&case.layout.memory);
        launch(
            backend,
            &self.tenant,
            &kernel,
            &case.config,
            &case.args,
            memory.bytes(),
            |c| c.wait_mut(),
        )
        .and_then(|done| done)
        .map_err(|e| format!("launch: {e}"))?;
        Ok(memory.bytes().to_vec())
    }
}

/// `gpu-suite bit-identity --device cpu --record DIR`: the CPU backend's memories (the Rust
/// reference for CUDA C++), written to `DIR`.
pub fn record(suite: &Suite, dir: &Path) -> anyhow::Result<Section> {
    if suite.is_cuda() {
        bail!("--record takes the CPU backend's results: run it with --device cpu");
    }
    let cpu = open_backend(DeviceChoice::Cpu)?;
    let mut kernels = Kernels::new(&*cpu);
    let mut data = Vec::new();
    let mut index = Vec::new();
    for case in cases() {
        let expected = match &case.cuda {
            Some((_, reference)) => reference.clone(),
            None => kernels
                .run(&case)
                .map_err(|e| anyhow::anyhow!("{}: the CPU backend failed: {e}", case.name))?,
        };
        index.push(json!({
            "name": case.name, "origin": case.origin.as_str(), "kernel": case.kernel,
            "input_sha256": sha256(&case.layout.memory),
            "offset": data.len(), "len": expected.len(),
        }));
        data.extend_from_slice(&expected);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(DATA), &data).context("writing the expected memories")?;
    let doc = json!({"cases": index, "data_sha256": sha256(&data), "bytes": data.len()});
    std::fs::write(dir.join(INDEX), serde_json::to_string_pretty(&doc)? + "\n")
        .context("writing the record's index")?;
    let mut section = Section::default();
    section.check(
        "the CPU backend ran every case of the conformance set",
        true,
        format!(
            "{} cases, {} bytes of expected memory",
            index.len(),
            data.len()
        ),
    );
    Ok(section)
}

/// `gpu-suite bit-identity --expected DIR`: every case on this backend against the record.
pub fn run(suite: &Suite, dir: &Path) -> anyhow::Result<Section> {
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(INDEX))
            .with_context(|| format!("reading {}", dir.join(INDEX).display()))?,
    )?;
    let data = std::fs::read(dir.join(DATA))
        .with_context(|| format!("reading {}", dir.join(DATA).display()))?;
    if index["data_sha256"].as_str() != Some(sha256(&data).as_str()) {
        bail!("{} does not match its index (corrupted record)", DATA);
    }
    let recorded: Vec<&Value> = index["cases"]
        .as_array()
        .context("the index lists no cases")?
        .iter()
        .collect();
    let backend = suite.backend()?;
    let mut kernels = Kernels::new(&*backend);
    let cases = cases();
    let mut section = Section::default();
    if recorded.len() != cases.len() {
        bail!(
            "the record has {} cases, this binary's conformance set {}: rebuild the artifact",
            recorded.len(),
            cases.len()
        );
    }
    let (mut rows, mut generated, mut tenant) = (Vec::new(), [0usize; 3], [0usize; 3]);
    let mut generated_failures = Vec::new();
    let mut tenant_differences = Vec::new();
    for (case, entry) in cases.iter().zip(&recorded) {
        if entry["name"].as_str() != Some(case.name.as_str())
            || entry["input_sha256"].as_str() != Some(sha256(&case.layout.memory).as_str())
        {
            bail!(
                "case {} differs from the record's {} (inputs or order): rebuild the artifact",
                case.name,
                entry["name"]
            );
        }
        let offset = entry["offset"].as_u64().context("offset")? as usize;
        let len = entry["len"].as_u64().context("len")? as usize;
        let expected = data.get(offset..offset + len).context("record too short")?;
        // counts: [checked, equal, not run]
        let counts = if case.origin == Origin::CudaCpp {
            &mut tenant
        } else {
            &mut generated
        };
        let outcome = match kernels.run(case) {
            Ok(actual) => match first_difference(case.dtype, expected, &actual) {
                None => Ok(()),
                Some(difference) => Err(difference),
            },
            Err(error) if case.origin == Origin::CudaCpp && !suite.is_cuda() => {
                counts[2] += 1;
                rows.push(json!({"case": case.name, "origin": case.origin.as_str(), "ran": false, "why": error}));
                continue;
            }
            Err(error) => Err(format!("did not run: {error}")),
        };
        counts[0] += 1;
        let equal = outcome.is_ok();
        if equal {
            counts[1] += 1;
        } else {
            let line = format!("{}: {}", case.name, outcome.as_ref().unwrap_err());
            if case.origin == Origin::CudaCpp {
                tenant_differences.push(line);
            } else {
                generated_failures.push(line);
            }
        }
        rows.push(json!({
            "case": case.name, "origin": case.origin.as_str(), "kernel": case.kernel,
            "grid": case.config.grid, "block": case.config.block,
            "memory_bytes": case.layout.memory.len(), "ran": true, "equal": equal,
            "difference": outcome.err(),
        }));
    }
    section.check(
        "every generated kernel (blueprints, builtins) leaves the memory bit-identical to the CPU backend",
        generated_failures.is_empty() && generated[0] > 0,
        format!(
            "{} of {} cases equal{}",
            generated[1],
            generated[0],
            if generated_failures.is_empty() {
                String::new()
            } else {
                format!("; differing: {}", generated_failures.join("; "))
            }
        ),
    );
    if tenant[0] > 0 {
        section.check(
            "every CUDA C++ test kernel leaves the memory its Rust reference predicts",
            tenant_differences.is_empty(),
            format!(
                "{} of {} kernels equal{}",
                tenant[1],
                tenant[0],
                if tenant_differences.is_empty() {
                    String::new()
                } else {
                    format!("; differences: {}", tenant_differences.join("; "))
                }
            ),
        );
    } else {
        section.note(format!(
            "the {} CUDA C++ test kernels did not run: they need a CUDA device and NVRTC",
            tenant[2]
        ));
    }
    section.set(
        "summary",
        json!({
            "generated_cases": generated[0], "generated_equal": generated[1],
            "generated_mismatches": generated[0] - generated[1],
            "cuda_cpp_cases": tenant[0], "cuda_cpp_equal": tenant[1], "cuda_cpp_not_run": tenant[2],
            "cuda_cpp_differences": tenant_differences,
            "fixed_cases_per_blueprint": FIXED_CASES, "fixed_cases_per_builtin": BUILTIN_FIXED_CASES,
            "record_bytes": data.len(),
        }),
    );
    section.set("cases", Value::Array(rows));
    Ok(section)
}
