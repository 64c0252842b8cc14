//! What every section shares: the suite's settings and provenance, the output file, the
//! backend, guest-sized memory on either backend, runtimes, timing statistics.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use serde_json::{json, Map, Value};
use tensor_wasm_gates::runinfo;
use tensor_wasm_gpu::{discover, open_backend, Backend, Device, DeviceChoice};
use tensor_wasm_mem::ManagedBuffer;
use tensor_wasm_runtime::{FsFunctionStore, GuestMemory, Runtime, RuntimeConfig, RuntimeMetrics};

use crate::Common;

/// Version of the section files' layout.
pub const SCHEMA: &str = "tensor-wasm/gpu-suite/1";

/// One check of a section: a named pass or fail with what was seen.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub pass: bool,
    pub detail: String,
}

/// What a section returns: its results (a JSON object), checks and notes.
#[derive(Debug, Default)]
pub struct Section {
    pub results: Map<String, Value>,
    pub checks: Vec<Check>,
    pub notes: Vec<String>,
    /// Measurements against the targets (a miss is a finding, not a failed check).
    pub targets: Vec<Value>,
}

impl Section {
    pub fn check(&mut self, name: impl Into<String>, pass: bool, detail: impl Into<String>) {
        let check = Check {
            name: name.into(),
            pass,
            detail: detail.into(),
        };
        println!(
            "  [{}] {}: {}",
            if check.pass { "pass" } else { "FAIL" },
            check.name,
            check.detail
        );
        self.checks.push(check);
    }

    pub fn set(&mut self, key: &str, value: Value) {
        self.results.insert(key.to_owned(), value);
    }

    /// Records `value` against `target` (`at_most`: lower is better).
    pub fn target(&mut self, name: &str, value: f64, target: f64, at_most: bool, unit: &str) {
        let met = if at_most {
            value <= target
        } else {
            value >= target
        };
        println!(
            "  target {name}: {value:.3} {unit} ({} {target} {unit}): {}",
            if at_most { "<=" } else { ">=" },
            if met { "met" } else { "MISSED" }
        );
        self.targets.push(json!({
            "name": name, "value": value, "target": target,
            "comparison": if at_most { "at_most" } else { "at_least" },
            "unit": unit, "met": met,
        }));
    }

    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        println!("  note: {note}");
        self.notes.push(note);
    }
}

/// The settings of this run and its provenance.
pub struct Suite {
    pub name: String,
    pub choice: DeviceChoice,
    pub out: PathBuf,
    pub quick: bool,
    provenance: Value,
    backend: OnceLock<Arc<dyn Backend>>,
    started: Instant,
}

impl Suite {
    pub fn new(name: &str, common: &Common) -> anyhow::Result<Self> {
        let choice = match common.device.as_str() {
            "cuda" => DeviceChoice::Cuda,
            "cpu" => DeviceChoice::Cpu,
            other => anyhow::bail!("--device must be cuda or cpu, not {other:?}"),
        };
        std::fs::create_dir_all(&common.out)
            .with_context(|| format!("creating {}", common.out.display()))?;
        let provenance = match &common.provenance {
            Some(path) => serde_json::from_str(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?,
            )
            .with_context(|| format!("parsing {}", path.display()))?,
            None => fallback_provenance(),
        };
        println!("gpu-suite {name} --device {}", common.device);
        Ok(Suite {
            name: name.to_owned(),
            choice,
            out: common.out.clone(),
            quick: common.quick,
            provenance,
            backend: OnceLock::new(),
            started: Instant::now(),
        })
    }

    pub fn is_cuda(&self) -> bool {
        self.choice == DeviceChoice::Cuda
    }

    /// The backend `--device` names (opened once).
    pub fn backend(&self) -> anyhow::Result<Arc<dyn Backend>> {
        if let Some(backend) = self.backend.get() {
            return Ok(backend.clone());
        }
        let backend = open_backend(self.choice).map_err(|e| {
            anyhow!(
                "cannot open the {} backend: {e}",
                if self.is_cuda() { "CUDA" } else { "CPU" }
            )
        })?;
        Ok(self.backend.get_or_init(|| backend).clone())
    }

    /// A scratch directory for runtimes and servers.
    pub fn scratch(&self) -> anyhow::Result<tempfile::TempDir> {
        tempfile::Builder::new()
            .prefix("gpu-suite-")
            .tempdir()
            .context("creating a scratch directory")
    }

    fn device_json(&self) -> Value {
        let device = match self.backend.get() {
            Some(backend) => Some(backend.device().clone()),
            None if self.is_cuda() => discover().cuda_devices.first().cloned().map(Device::Cuda),
            None => Some(Device::Cpu),
        };
        match device {
            Some(Device::Cuda(info)) => json!({
                "kind": "cuda",
                "name": info.name,
                "sm": info.sm_name(),
                "compute_capability": [info.compute_capability.0, info.compute_capability.1],
                "driver_cuda_version": info.driver_version_text(),
                "total_memory_bytes": info.total_memory_bytes,
                "multiprocessors": info.multiprocessor_count,
                "pageable_memory_access": info.pageable_memory_access,
                "concurrent_managed_access": info.concurrent_managed_access,
            }),
            Some(Device::Cpu) => json!({"kind": "cpu", "cores": runinfo::machine().cores}),
            None => json!({"kind": "none", "why": discover().cuda_unavailable}),
        }
    }

    /// Writes `<out>/<name>.json` and turns the outcome into the exit code: 0 when every
    /// check passed, 1 when one failed, 2 when the section could not run.
    pub fn finish(&self, outcome: anyhow::Result<Section>) -> ExitCode {
        let (section, error) = match outcome {
            Ok(section) => (section, None),
            Err(error) => (Section::default(), Some(format!("{error:#}"))),
        };
        let passed = error.is_none() && section.checks.iter().all(|c| c.pass);
        let cuda = self.is_cuda();
        let label = if cuda {
            "GPU (CUDA backend)".to_owned()
        } else {
            "CPU backend: NOT a GPU measurement (CPU-side test of the suite)".to_owned()
        };
        let field = |key: &str| self.provenance.get(key).cloned().unwrap_or(Value::Null);
        let command = format!(
            "{} :: {}",
            self.provenance
                .get("command")
                .and_then(Value::as_str)
                .unwrap_or("(no runner)"),
            std::env::args().collect::<Vec<_>>().join(" ")
        );
        let doc = json!({
            "schema": SCHEMA,
            "section": self.name,
            "backend": if cuda { "cuda" } else { "cpu" },
            "gpu_measurement": cuda,
            "label": label,
            "quick": self.quick,
            "machine": field("machine"),
            "gpu": field("gpu"),
            "driver": field("driver"),
            "cuda_version": field("cuda_version"),
            "commit": field("commit"),
            "date": field("date"),
            "command": command,
            "provenance": self.provenance,
            "device": self.device_json(),
            "passed": passed,
            "error": error,
            "wall_s": self.started.elapsed().as_secs_f64(),
            "results": Value::Object(section.results),
            "checks": section.checks.iter().map(|c| json!({
                "name": c.name, "pass": c.pass, "detail": c.detail,
            })).collect::<Vec<_>>(),
            "notes": section.notes,
            "targets": section.targets,
        });
        let path = self.out.join(format!("{}.json", self.name));
        let text = serde_json::to_string_pretty(&doc).expect("JSON values serialise");
        if let Err(e) = std::fs::write(&path, text + "\n") {
            eprintln!(
                "gpu-suite {}: cannot write {}: {e}",
                self.name,
                path.display()
            );
            return ExitCode::from(2);
        }
        match &error {
            Some(error) => {
                eprintln!("gpu-suite {}: ERROR: {error}", self.name);
                println!("wrote {} (error)", path.display());
                ExitCode::from(2)
            }
            None => {
                let failed = section.checks.iter().filter(|c| !c.pass).count();
                println!(
                    "wrote {} ({} checks, {failed} failed)",
                    path.display(),
                    section.checks.len()
                );
                if failed == 0 {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// Provenance when no runner wrote one: this machine, `$GPU_SUITE_COMMIT` or git, now.
fn fallback_provenance() -> Value {
    let machine = runinfo::machine();
    json!({
        "machine": {
            "cpu": machine.cpu, "cores": machine.cores, "kernel": machine.kernel,
            "arch": machine.arch,
        },
        "gpu": Value::Null,
        "driver": "unknown (no runner provenance)",
        "cuda_version": "unknown (no runner provenance)",
        "commit": std::env::var("GPU_SUITE_COMMIT").unwrap_or_else(|_| runinfo::commit()),
        "date": runinfo::utc_now(),
        "command": Value::Null,
    })
}

/// Memory a kernel can use on either backend: CUDA managed memory (what guest memory is on
/// CUDA) or a host buffer.
pub enum Memory {
    Host(Vec<u8>),
    Managed(ManagedBuffer),
}

impl Memory {
    /// `len` zeroed bytes usable by `backend`'s kernels.
    pub fn new(backend: &dyn Backend, len: usize) -> anyhow::Result<Self> {
        Ok(match backend.cuda_context() {
            Some(ctx) => Memory::Managed(
                ManagedBuffer::new(&ctx, len)
                    .with_context(|| format!("allocating {len} bytes of managed memory"))?,
            ),
            None => Memory::Host(vec![0; len]),
        })
    }

    pub fn bytes(&mut self) -> &mut [u8] {
        match self {
            Memory::Host(v) => v,
            Memory::Managed(m) => m.as_mut_slice(),
        }
    }

    pub fn managed(&self) -> Option<&ManagedBuffer> {
        match self {
            Memory::Host(_) => None,
            Memory::Managed(m) => Some(m),
        }
    }
}

/// The cap on a command's stdout in the suite's runtimes and servers: the launcher writes the
/// whole output buffer of a plan (the largest, a 4-D permute of 6.4 M elements, is 25.7 MB),
/// past the default 16 MiB.
pub const MAX_OUTPUT_BYTES: usize = 128 << 20;

/// A runtime over `backend` with unified guest memory (as `serve --guest-memory unified`;
/// CUDA forces it), `instances` slots and memory limits up to `max_memory` bytes.
pub fn runtime(
    backend: Arc<dyn Backend>,
    dir: &Path,
    max_memory: u64,
    instances: u32,
    allow_raw_ptx: bool,
) -> anyhow::Result<Runtime> {
    let isolation = backend.isolation();
    let config = RuntimeConfig {
        backend,
        guest_memory: GuestMemory::Unified,
        max_instances: instances,
        default_memory_limit_bytes: max_memory.min(16 << 20),
        max_memory_limit_bytes: max_memory,
        default_timeout: Duration::from_secs(300),
        max_timeout: Duration::from_secs(600),
        allow_raw_ptx,
        gpu_isolation: isolation,
        max_output_bytes: MAX_OUTPUT_BYTES,
        ..RuntimeConfig::new(dir)
    };
    let store = Arc::new(FsFunctionStore::open(dir).context("function store")?);
    let metrics = RuntimeMetrics::register(&prometheus::Registry::new())
        .map_err(|e| anyhow!("metrics: {e}"))?;
    Runtime::open(config, store, metrics).context("opening the runtime")
}

/// Order statistics of samples in nanoseconds (nearest rank).
pub fn stats_ns(samples: &[f64]) -> Value {
    if samples.is_empty() {
        return json!({"n": 0});
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let index = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
        sorted[index]
    };
    let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
    json!({
        "n": sorted.len(),
        "min_ns": sorted[0],
        "p50_ns": rank(0.50),
        "p90_ns": rank(0.90),
        "p99_ns": rank(0.99),
        "max_ns": sorted[sorted.len() - 1],
        "mean_ns": mean,
    })
}

/// The `p` quantile of `samples` by nearest rank (0 when empty).
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// The median of `samples` (0 when empty).
pub fn median(samples: &[f64]) -> f64 {
    percentile(samples, 0.5)
}

/// What the driver reports about the CUDA device of `backend` (None on the CPU).
pub fn cuda_info(backend: &dyn Backend) -> Option<tensor_wasm_gpu::CudaDeviceInfo> {
    match backend.device() {
        Device::Cuda(info) => Some(info.clone()),
        Device::Cpu => None,
    }
}

/// Nanoseconds since `start`.
pub fn elapsed_ns(start: Instant) -> f64 {
    start.elapsed().as_nanos() as f64
}
