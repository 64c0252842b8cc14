//! `gpu-suite`: the measurement and correctness binary of the GPU validation suite
//! (`make gpu-suite`, `scripts/gpu-suite/run.sh`).
//!
//! Each subcommand is one section of the suite. It runs on the backend `--device` names
//! (`cuda` on the GPU machine; `cpu` anywhere, which is the suite's CPU-side test) and writes
//! `<out>/<section>.json`: the provenance the runner recorded (machine, GPU, driver, CUDA
//! version, commit, date) plus the command of this process, the device the numbers were taken
//! on (CPU numbers say so in `label`: they are never GPU numbers), the results and the checks.
//!
//! | section | what |
//! |---|---|
//! | `bit-identity` | every kernel of the conformance set (blueprints × dtypes and builtins on their fixed cases, the CUDA C++ test kernels): the whole memory after the launch compared with the CPU backend's record from the build machine |
//! | `correctness` | every blueprint and builtin through the runtime API (guest → `wasi:cuda` → dispatcher → backend), equal to the CPU backend; hostile out-of-bounds launches refused before launch |
//! | `http-check` | the real server binary over HTTP: every example and every blueprint, recorded or compared with a CPU record |
//! | `latency` | launch to completion: raw cudarc launch + sync, the backend's `launch`, and the guest ABI, interleaved |
//! | `throughput` | vector add, matmul, conv2d kernels over prefetched managed memory (the torch peer is `torch_peer.py`) |
//! | `unified-memory` | first-touch vs prefetched bandwidth of guest memory; zero-copy check of pointer arguments |
//! | `jit` | NVRTC compile, PTX load vs cubin load, blueprint cold compile vs warm caches |
//! | `cold-start` | snapshot restore to first kernel vs a fresh instance |
//! | `concurrency` | dispatch throughput and latency with 1, 8 and 64 concurrent guests |

mod bitident;
mod coldstart;
mod common;
mod concurrency;
mod correctness;
mod fence;
mod http;
mod jit;
mod latency;
mod nn;
mod plan;
mod raw;
mod throughput;
mod unified;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use common::{Section, Suite};

#[derive(Debug, Parser)]
#[command(
    name = "gpu-suite",
    about = "GPU validation suite of TensorWasm (one section per run)"
)]
struct Cli {
    #[command(subcommand)]
    section: SectionCommand,
}

/// Flags every section takes.
#[derive(Debug, Args, Clone)]
pub struct Common {
    /// Backend: `cuda` (the GPU machine) or `cpu` (the CPU-side test; numbers labelled CPU).
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Directory the section's JSON file is written to.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Provenance JSON the runner wrote (machine, GPU, driver, CUDA, commit, date, command).
    #[arg(long)]
    provenance: Option<PathBuf>,
    /// Small problem sizes and few repetitions (the CPU dry run).
    #[arg(long)]
    quick: bool,
}

#[derive(Debug, Subcommand)]
enum SectionCommand {
    /// Every kernel of the conformance set against the CPU backend's record (or, with
    /// `--record`, that record made on the CPU backend).
    BitIdentity {
        #[command(flatten)]
        common: Common,
        /// Directory with the CPU record (`bit-identity.json`, `bit-identity.bin`) to compare with.
        #[arg(long, conflicts_with = "record", required_unless_present = "record")]
        expected: Option<PathBuf>,
        /// Write the CPU backend's record to this directory instead (with `--device cpu`).
        #[arg(long)]
        record: Option<PathBuf>,
        /// Name of the output file (without `.json`).
        #[arg(long, default_value = "bit-identity")]
        name: String,
    },
    /// Every blueprint and builtin through the runtime API, against the CPU backend.
    Correctness {
        #[command(flatten)]
        common: Common,
        /// Fewer, smaller cases (the run under compute-sanitizer).
        #[arg(long)]
        subset: bool,
        /// Name of the output file (without `.json`).
        #[arg(long, default_value = "correctness")]
        name: String,
    },
    /// The real server over HTTP: every example and blueprint.
    HttpCheck {
        #[command(flatten)]
        common: Common,
        /// The `tensor-wasm` binary to start.
        #[arg(long)]
        server: PathBuf,
        /// Directory with the example modules (`*.wat` and `c/*.wasm`).
        #[arg(long)]
        examples: PathBuf,
        /// Records that the responses must equal (normally CPU-backend records).
        #[arg(long)]
        expected: Vec<PathBuf>,
        /// Name of the output file (without `.json`).
        #[arg(long, default_value = "http-check")]
        name: String,
    },
    /// wasi-nn: the artifact's ONNX cases through the real server, gpu target against cpu
    /// target (identical bytes) and ONNX Runtime (tolerance).
    WasiNn {
        #[command(flatten)]
        common: Common,
        /// The `tensor-wasm` binary to start.
        #[arg(long)]
        server: PathBuf,
        /// Directory with the example modules (`c/nn_run.wasm`).
        #[arg(long)]
        examples: PathBuf,
        /// Directories with ONNX cases (`scripts/onnx/graphs.py`'s and `models.py`'s output).
        #[arg(long, required = true)]
        cases: Vec<PathBuf>,
    },
    /// Launch-to-completion latency: raw cudarc vs backend launch vs guest ABI.
    Latency(Common),
    /// Kernel throughput: vector add, matmul, conv2d.
    Throughput(Common),
    /// Unified memory: first touch vs prefetched; zero-copy check.
    UnifiedMemory(Common),
    /// JIT: NVRTC, PTX vs cubin load, blueprint cold vs warm.
    Jit(Common),
    /// Snapshot restore to first kernel vs fresh instance.
    ColdStart(Common),
    /// Dispatch with 1, 8 and 64 concurrent guests.
    Concurrency(Common),
    /// Tenant kernels fenced by the PTX verifier: bytes against the references, wall clock.
    Fence(Common),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, common): (String, Common) = match &cli.section {
        SectionCommand::BitIdentity {
            common,
            record,
            name,
            ..
        } => (
            if record.is_some() {
                "bit-identity-record".into()
            } else {
                name.clone()
            },
            common.clone(),
        ),
        SectionCommand::Correctness { common, name, .. }
        | SectionCommand::HttpCheck { common, name, .. } => (name.clone(), common.clone()),
        SectionCommand::WasiNn { common, .. } => ("wasi-nn".into(), common.clone()),
        SectionCommand::Latency(c) => ("latency".into(), c.clone()),
        SectionCommand::Throughput(c) => ("throughput".into(), c.clone()),
        SectionCommand::UnifiedMemory(c) => ("unified-memory".into(), c.clone()),
        SectionCommand::Jit(c) => ("jit".into(), c.clone()),
        SectionCommand::ColdStart(c) => ("cold-start".into(), c.clone()),
        SectionCommand::Concurrency(c) => ("concurrency".into(), c.clone()),
        SectionCommand::Fence(c) => ("fence".into(), c.clone()),
    };
    let suite = match Suite::new(&name, &common) {
        Ok(suite) => suite,
        Err(error) => {
            eprintln!("gpu-suite {name}: {error:#}");
            return ExitCode::from(2);
        }
    };
    let outcome: anyhow::Result<Section> = match cli.section {
        SectionCommand::BitIdentity {
            expected, record, ..
        } => match (record, expected) {
            (Some(dir), _) => bitident::record(&suite, &dir),
            (None, Some(dir)) => bitident::run(&suite, &dir),
            (None, None) => unreachable!("clap requires --expected or --record"),
        },
        SectionCommand::Correctness { subset, .. } => correctness::run(&suite, subset),
        SectionCommand::HttpCheck {
            server,
            examples,
            expected,
            ..
        } => http::run(&suite, &server, &examples, &expected),
        SectionCommand::WasiNn {
            server,
            examples,
            cases,
            ..
        } => nn::run(&suite, &server, &examples, &cases),
        SectionCommand::Latency(_) => latency::run(&suite),
        SectionCommand::Throughput(_) => throughput::run(&suite),
        SectionCommand::UnifiedMemory(_) => unified::run(&suite),
        SectionCommand::Jit(_) => jit::run(&suite),
        SectionCommand::ColdStart(_) => coldstart::run(&suite),
        SectionCommand::Concurrency(_) => concurrency::run(&suite),
        SectionCommand::Fence(_) => fence::run(&suite),
    };
    suite.finish(outcome)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use sha2::Digest as _;
    use std::process::Command;

    use tensor_wasm_gpu::{open_backend, DeviceChoice};

    use crate::{coldstart, correctness, plan, unified};

    fn compiles(wat: &str) {
        wasmtime::Module::new(&wasmtime::Engine::default(), wat).expect("the guest compiles");
    }

    #[test]
    fn the_guests_compile() {
        compiles(plan::LAUNCHER_WAT);
        compiles(&unified::probe_wat());
        compiles(&coldstart::guest(1 << 20));
        compiles(correctness::VECTOR_ADD_WAT);
    }

    #[test]
    fn plans_encode_within_the_launcher_layout() {
        let plans = plan::catalogue(2).unwrap();
        // Every blueprint in f32 and i32 (where defined), two shapes each, 3 builtins.
        let blueprints = tensor_wasm_jit::conformance::blueprints().len();
        assert_eq!(plans.len(), blueprints * 2 + 3 * 2);
        for p in plans.iter().chain(&plan::hostile_plans()) {
            let bytes = p.encode().unwrap();
            assert_eq!(bytes.len(), plan::PLAN_BYTES);
            assert_eq!(&bytes[64..64 + p.descriptor.len()], p.descriptor.as_bytes());
            assert!(
                p.fills.iter().all(|(o, _, _)| *o >= plan::DATA_BASE),
                "{}",
                p.name
            );
        }
        let names: std::collections::HashSet<_> = plans.iter().map(|p| &p.name).collect();
        assert_eq!(names.len(), plans.len(), "plan names are unique");
        // The launcher's stdout (a header, a message of up to 4 KiB, the
        // timings, the output buffer) fits
        // under the cap the HTTP section's server runs with.
        for p in &plans {
            let stdout = 12 + 4096 + 8 * u64::from(plan::MAX_REPEATS) + p.out.1;
            assert!(
                stdout <= crate::common::MAX_OUTPUT_BYTES as u64,
                "{}: {stdout} bytes of output",
                p.name
            );
        }
    }

    #[test]
    fn a_case_has_the_same_inputs_whatever_else_runs() {
        let one = plan::catalogue(1).unwrap();
        let two = plan::catalogue(2).unwrap();
        for p in &one {
            let q = two.iter().find(|q| q.name == p.name).unwrap();
            assert_eq!(p.memory_image(), q.memory_image(), "{}", p.name);
        }
    }

    #[test]
    fn bit_identity_reproduces_its_own_record_and_refuses_a_corrupted_one() {
        let dir = tempfile::tempdir().unwrap();
        let common = crate::Common {
            device: "cpu".into(),
            out: dir.path().join("out"),
            provenance: None,
            quick: false,
        };
        let record = dir.path().join("expected");
        let suite = crate::Suite::new("bit-identity-record", &common).unwrap();
        let made = crate::bitident::record(&suite, &record).unwrap();
        assert!(made.checks.iter().all(|c| c.pass));
        let suite = crate::Suite::new("bit-identity", &common).unwrap();
        let section = crate::bitident::run(&suite, &record).unwrap();
        assert_eq!(
            section.checks.len(),
            1,
            "CUDA C++ kernels are not run on the CPU"
        );
        assert!(section.checks[0].pass, "{}", section.checks[0].detail);
        let summary = &section.results["summary"];
        assert_eq!(summary["generated_mismatches"], 0);
        assert!(summary["generated_cases"].as_u64().unwrap() > 500);
        assert_eq!(
            summary["cuda_cpp_not_run"],
            tensor_wasm_jit::conformance::cuda_cases().len()
        );

        // One expected byte changed (the index updated to match): the case is named.
        let data_path = record.join("bit-identity.bin");
        let mut data = std::fs::read(&data_path).unwrap();
        data[100] ^= 0x40;
        std::fs::write(&data_path, &data).unwrap();
        let index_path = record.join("bit-identity.json");
        let mut index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
        let digest: String = sha2::Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        index["data_sha256"] = digest.into();
        std::fs::write(&index_path, index.to_string()).unwrap();
        let section = crate::bitident::run(&suite, &record).unwrap();
        assert!(!section.checks[0].pass);
        let first = index["cases"][0]["name"].as_str().unwrap();
        assert!(
            section.checks[0]
                .detail
                .contains(&format!("{first}: 1 word(s) differ")),
            "{}",
            section.checks[0].detail
        );

        // A record whose data no longer matches its index is refused.
        data[0] ^= 1;
        std::fs::write(&data_path, &data).unwrap();
        let error = crate::bitident::run(&suite, &record).err().unwrap();
        assert!(
            format!("{error:#}").contains("corrupted record"),
            "{error:#}"
        );
    }

    #[test]
    fn the_launcher_runs_every_plan_like_the_cpu_backend() {
        // The whole guest path on the CPU backend: what `correctness` checks on a GPU.
        let cpu = open_backend(DeviceChoice::Cpu).unwrap();
        let plans = plan::catalogue(1).unwrap();
        let limit = correctness::memory_limit(&plans);
        let dir = tempfile::tempdir().unwrap();
        let rt = crate::common::runtime(cpu.clone(), dir.path(), limit, 4, false).unwrap();
        let id = correctness::deploy_launcher(&rt, limit).unwrap();
        for p in &plans {
            let run = correctness::invoke_plan(&rt, &id, &p.with_launches(1, 2)).unwrap();
            assert_eq!(run.status, 0, "{}: {}", p.name, run.message);
            assert_eq!(run.timings_ns.len(), 2);
            let expected = p.reference(&*cpu).unwrap();
            assert_eq!(
                plan::compare(p.out_type, &run.out, &expected),
                (0, None),
                "{}",
                p.name
            );
            assert_ne!(
                expected,
                vec![0xA5; expected.len()],
                "{} computed nothing",
                p.name
            );
        }
        for p in plan::hostile_plans() {
            let run = correctness::invoke_plan(&rt, &id, &p).unwrap();
            assert_eq!(run.status, -1, "{}", p.name);
        }
    }

    #[test]
    fn the_digest_ignores_nan_payloads_only() {
        let a = [
            f32::from_bits(0x7fc0_0001).to_le_bytes(),
            1.0f32.to_le_bytes(),
        ]
        .concat();
        let b = [
            f32::from_bits(0xffc0_0000).to_le_bytes(),
            1.0f32.to_le_bytes(),
        ]
        .concat();
        let c = [f32::NAN.to_le_bytes(), 2.0f32.to_le_bytes()].concat();
        assert_eq!(
            plan::digest(plan::OutType::F32, &a),
            plan::digest(plan::OutType::F32, &b)
        );
        assert_ne!(
            plan::digest(plan::OutType::F32, &a),
            plan::digest(plan::OutType::F32, &c)
        );
        assert_ne!(
            plan::digest(plan::OutType::I32, &a),
            plan::digest(plan::OutType::I32, &b)
        );
        assert_eq!(plan::compare(plan::OutType::F32, &a, &b), (0, None));
        assert_eq!(plan::compare(plan::OutType::F32, &a, &c), (1, Some(1)));
    }

    /// `$TENSOR_WASM_PTXAS`, or the copy `scripts/install-deps.sh` puts under `.tools/`.
    fn ptxas() -> PathBuf {
        if let Some(path) = std::env::var_os("TENSOR_WASM_PTXAS") {
            return PathBuf::from(path);
        }
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/cuda/bin/ptxas");
        assert!(
            path.exists(),
            "ptxas not found at {} (run scripts/install-deps.sh or set TENSOR_WASM_PTXAS)",
            path.display()
        );
        path
    }

    #[test]
    fn the_zero_copy_probe_assembles_with_ptxas() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("probe.ptx");
        std::fs::write(&source, unified::PROBE_PTX).unwrap();
        for arch in ["sm_80", "sm_90"] {
            let out = Command::new(ptxas())
                .arg(format!("-arch={arch}"))
                .arg(&source)
                .arg("-o")
                .arg(dir.path().join(format!("probe-{arch}.cubin")))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
