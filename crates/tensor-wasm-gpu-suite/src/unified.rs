//! `unified-memory`: what guest memory (CUDA managed memory on CUDA) costs a kernel, and
//! the zero-copy claim.
//!
//! Bandwidth: a buffer of guest-memory kind, half input and half output, is written by the
//! host (all pages on the host, as after a guest fills its inputs), then the builtin `scale`
//! runs over it:
//! - **first touch**: the kernel's page faults migrate the pages to the device;
//! - **resident**: the same kernel again, pages already on the device;
//! - **prefetched**: after the host wrote it again, `cuMemPrefetchAsync` to the device
//!   (timed on its own), then the kernel.
//!
//! Zero copy: a guest granted raw PTX launches a kernel that (1) stores the address it
//! received for a buffer argument into another buffer and (2) writes a marker 4096 bytes past
//! that buffer, at a guest offset that belongs to no argument. The guest then reads the
//! marker from its own memory. Only a kernel handed a pointer into the guest's memory itself
//! can put it there: a runtime that staged arguments through device copies would hand the
//! kernel a separate allocation, and the marker would not appear in guest memory.

use std::time::Instant;

use anyhow::{anyhow, Context as _};
use serde_json::{json, Value};
use tensor_wasm_gpu::{launch, BuiltinKernel, KernelArg, LaunchConfig, TenantKey};
use tensor_wasm_runtime::DeploySpec;

use crate::common::{elapsed_ns, median, runtime, Memory, Section, Suite};
use crate::raw;

/// Tenant PTX of the zero-copy probe (see the module docs).
pub const PROBE_PTX: &str = ".version 8.0
.target sm_80
.address_size 64

.visible .entry zero_copy_probe(
\t.param .u64 zero_copy_probe_param_0,
\t.param .u64 zero_copy_probe_param_1
)
{
\t.reg .b32 %r<2>;
\t.reg .b64 %rd<6>;

\tld.param.u64 %rd1, [zero_copy_probe_param_0];
\tld.param.u64 %rd2, [zero_copy_probe_param_1];
\tcvta.to.global.u64 %rd3, %rd1;
\tst.global.u64 [%rd3], %rd2;
\tadd.s64 %rd4, %rd2, 4096;
\tcvta.to.global.u64 %rd5, %rd4;
\tmov.u32 %r1, 1514492495;
\tst.global.u32 [%rd5], %r1;
\tret;
}
";

/// The marker the probe writes ("OREZ" little-endian, 0x5a45524f).
const MARKER: u32 = 0x5a45_524f;

/// The probe guest: `probe() -> (i32, i64)`: 1 when the marker is in guest memory (0 when
/// not, the ABI error code when the kernel could not be loaded or launched), and the address
/// the kernel received.
pub fn probe_wat() -> String {
    let escaped: String = PROBE_PTX
        .chars()
        .map(|c| match c {
            '\n' => "\\n".to_owned(),
            '\t' => "\\t".to_owned(),
            '"' => "\\\"".to_owned(),
            '\\' => "\\\\".to_owned(),
            c => c.to_string(),
        })
        .collect();
    format!(
        r#"(module
  (import "wasi:cuda" "kernel_from_ptx" (func $ptx (param i32 i32 i32 i32) (result i32)))
  (import "wasi:cuda" "launch"
    (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "zero_copy_probe")
  (data (i32.const 16384) "{escaped}")
  (func $record (param $at i32) (param $tag i32) (param $aux i32) (param $value i64)
    (i32.store (local.get $at) (local.get $tag))
    (i32.store offset=4 (local.get $at) (local.get $aux))
    (i64.store offset=8 (local.get $at) (local.get $value)))
  (func (export "probe") (result i32 i64)
    (local $k i32) (local $rc i32)
    (local.set $k (call $ptx (i32.const 16384) (i32.const {len}) (i32.const 1024) (i32.const 15)))
    (if (i32.lt_s (local.get $k) (i32.const 0)) (then (return (local.get $k) (i64.const 0))))
    (call $record (i32.const 0) (i32.const 7) (i32.const 8) (i64.const 4096))
    (call $record (i32.const 16) (i32.const 7) (i32.const 64) (i64.const 8192))
    (local.set $rc (call $launch (local.get $k) (i32.const 1) (i32.const 1) (i32.const 1)
      (i32.const 1) (i32.const 1) (i32.const 1) (i32.const 0) (i32.const 0) (i32.const 32)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc) (i64.const 0))))
    (i32.eq (i32.load (i32.const 12288)) (i32.const {MARKER}))
    (i64.load (i32.const 4096))))
"#,
        len = PROBE_PTX.len(),
    )
}

pub fn run(suite: &Suite) -> anyhow::Result<Section> {
    let backend = suite.backend()?;
    let size: usize = if suite.quick { 16 << 20 } else { 1 << 30 };
    let rounds = 3;
    let half = size / 2;
    let n = u32::try_from(half / 4)?;
    let mut memory = Memory::new(&*backend, size)?;
    let kernel = backend.load_builtin(BuiltinKernel::Scale)?;
    let tenant = TenantKey::new("gpu-suite-unified");
    let args = [
        KernelArg::Buffer {
            offset: 0,
            len: half as u64,
        },
        KernelArg::Buffer {
            offset: half as u64,
            len: half as u64,
        },
        KernelArg::F32(2.0),
        KernelArg::U32(n),
    ];
    let config = LaunchConfig::linear(n, 256);
    let stream = match backend.cuda_context() {
        Some(ctx) => Some(raw::stream(&ctx)?),
        None => None,
    };
    let run_kernel = |memory: &mut Memory| -> anyhow::Result<f64> {
        let start = Instant::now();
        launch(
            &*backend,
            &tenant,
            &kernel,
            &config,
            &args,
            memory.bytes(),
            |c| c.wait_mut(),
        )??;
        Ok(elapsed_ns(start))
    };
    let host_touch = |memory: &mut Memory, round: usize| {
        let bytes = memory.bytes();
        for (i, word) in bytes[..half].chunks_exact_mut(4).enumerate() {
            word.copy_from_slice(&(((i + round) % 1000) as f32).to_le_bytes());
        }
        bytes[half..].fill(0);
    };
    let (mut first, mut resident, mut prefetch, mut prefetched) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        host_touch(&mut memory, round);
        first.push(run_kernel(&mut memory)?);
        resident.push(run_kernel(&mut memory)?);
        if let Some(stream) = &stream {
            host_touch(&mut memory, round + 1);
            let managed = memory
                .managed()
                .ok_or_else(|| anyhow!("CUDA memory is managed"))?;
            let start = Instant::now();
            managed
                .prefetch_to_device(stream)
                .map_err(|e| anyhow!("prefetch: {e}"))?;
            stream
                .synchronize()
                .map_err(|e| anyhow!("cuStreamSynchronize: {e}"))?;
            prefetch.push(elapsed_ns(start));
            prefetched.push(run_kernel(&mut memory)?);
        }
    }
    let ok = {
        let bytes = memory.bytes();
        (0..n as usize).step_by(4099).all(|i| {
            let x = f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4"));
            let y =
                f32::from_le_bytes(bytes[half + 4 * i..half + 4 * i + 4].try_into().expect("4"));
            y.to_bits() == (2.0 * x).to_bits()
        })
    };
    let mut section = Section::default();
    section.check(
        "scale over guest-kind memory computed 2x",
        ok,
        "sampled outputs of the last launch",
    );
    let gbps = |samples: &[f64]| {
        if samples.is_empty() {
            Value::Null
        } else {
            json!(size as f64 / (median(samples) * 1e-9) / 1e9)
        }
    };
    section.set(
        "bandwidth",
        json!({
            "buffer_bytes": size,
            "bytes_per_kernel": size,
            "kernel": "scale (reads half the buffer, writes the other half)",
            "memory": if stream.is_some() { "CUDA managed memory (tensor_wasm_mem::ManagedBuffer, the guest memory of CUDA hosts)" } else { "host memory (CPU backend)" },
            "rounds": rounds,
            "first_touch_ns": first,
            "resident_ns": resident,
            "prefetch_ns": prefetch,
            "prefetched_kernel_ns": prefetched,
            "first_touch_gb_per_s": gbps(&first),
            "resident_gb_per_s": gbps(&resident),
            "prefetch_migration_gb_per_s": gbps(&prefetch),
            "prefetched_kernel_gb_per_s": gbps(&prefetched),
            "prefetch_plus_kernel_gb_per_s": if prefetch.is_empty() { Value::Null } else {
                json!(size as f64 / ((median(&prefetch) + median(&prefetched)) * 1e-9) / 1e9)
            },
        }),
    );
    drop(memory);
    zero_copy(suite, &mut section)?;
    Ok(section)
}

fn zero_copy(suite: &Suite, section: &mut Section) -> anyhow::Result<()> {
    let backend = suite.backend()?;
    let dir = suite.scratch()?;
    let rt = runtime(backend.clone(), dir.path(), 16 << 20, 4, true)?;
    let spec = DeploySpec {
        raw_ptx: true,
        memory_limit_bytes: Some(4 << 20),
        ..DeploySpec::export("gpu-suite-zero-copy")
    };
    let id = rt
        .deploy(probe_wat().as_bytes(), spec)
        .context("deploying the zero-copy probe")?
        .record
        .id;
    let results = rt.invoke_export(&id, "probe", &[])?;
    let status = results.first().and_then(Value::as_i64).unwrap_or(i64::MIN);
    let address = results.get(1).cloned().unwrap_or(Value::Null);
    if suite.is_cuda() {
        section.check(
            "zero copy: a kernel given a buffer argument wrote into the guest's own memory \
             outside every argument",
            status == 1,
            format!(
                "probe returned {results:?} (1 = marker found at guest offset 12288; the \
                 kernel received address {address} for guest offset 8192)"
            ),
        );
    } else {
        section.note(format!(
            "zero copy is not applicable on the CPU backend (kernels run on the guest memory \
             slice itself); the probe's raw PTX returned {results:?} (-2 = NOT_AVAILABLE)"
        ));
    }
    section.set(
        "zero_copy",
        json!({
            "method": "tenant PTX stores the address of buffer argument 2 (guest offset 8192) and writes a marker at that address + 4096 (guest offset 12288, in no argument); the guest reads the marker from its memory",
            "results": results,
            "applicable": suite.is_cuda(),
            "passed": suite.is_cuda() && status == 1,
        }),
    );
    Ok(())
}
