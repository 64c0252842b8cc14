//! Tenant kernels on the CPU backend, through its public API (`load_fenced_ptx`, `launch`):
//! every CUDA C++ kernel of the conformance set, fenced, leaves the memory its Rust reference
//! predicts; a hostile fenced kernel stays inside its guest memory; a spinning one ends when
//! its launch is cancelled (the invocation's deadline), by its own poll of the cancel word;
//! a kernel is refused for another tenant.

use std::time::{Duration, Instant};

use tensor_wasm_gpu::{
    compile_cuda, launch, nvrtc_available, open_backend, Backend, DeviceChoice, GpuError,
    KernelArg, LaunchConfig, TenantKey,
};
use tensor_wasm_jit::conformance::{cuda_cases, first_difference};

fn cpu() -> std::sync::Arc<dyn Backend> {
    open_backend(DeviceChoice::Cpu).unwrap()
}

#[test]
fn every_cuda_kernel_fenced_runs_on_the_cpu_backend_like_its_reference() {
    if let Err(reason) = nvrtc_available() {
        println!("skipped: {reason}");
        return;
    }
    let backend = cpu();
    let tenant = TenantKey::new("tn-corpus");
    for case in cuda_cases() {
        let entry = case.kernel.entry;
        let binary = compile_cuda(case.kernel.source, entry, (8, 0)).unwrap();
        let fenced = tensor_wasm_ptx_verify::fence(&binary.ptx).unwrap();
        let kernel = backend
            .load_fenced_ptx(&tenant, &fenced.ptx, entry)
            .unwrap_or_else(|e| panic!("{entry}: {e}"));
        let mut memory = case.layout.memory.clone();
        launch(
            &*backend,
            &tenant,
            &kernel,
            &case.config,
            &case.args,
            &mut memory,
            |c| c.wait_mut(),
        )
        .and_then(|outcome| outcome)
        .unwrap_or_else(|e| panic!("{entry}: {e}"));
        if let Some(difference) = first_difference(case.dtype, &case.expected, &memory) {
            panic!("{entry}: {difference}");
        }
    }
}

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// Writes `value` at `p + offset` (a 64-bit offset parameter): any address at all.
const WILD_STORE: &str =
    ".visible .entry wild(.param .u64 p, .param .u64 offset, .param .u32 value)\n\
{\n.reg .b32 %r<2>;\n.reg .b64 %rd<4>;\n\
ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [offset]; ld.param.u32 %r1, [value];\n\
add.u64 %rd3, %rd1, %rd2; st.global.u32 [%rd3], %r1;\nret;\n}\n";

/// Loops until a counter it never changes reaches a value.
const SPIN: &str = ".visible .entry spin(.param .u64 p)\n\
{\n.reg .pred %p<2>;\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
ld.param.u64 %rd1, [p]; mov.u32 %r1, 0;\n\
LOOP: ld.global.u32 %r1, [%rd1]; setp.ne.u32 %p1, %r1, 12345; @%p1 bra LOOP;\nret;\n}\n";

#[test]
fn a_wild_store_lands_inside_the_guest_memory_fenced_and_faults_unfenced() {
    let backend = cpu();
    let tenant = TenantKey::new("tn-hostile");
    let ptx = format!("{HEADER}{WILD_STORE}");
    let fenced = tensor_wasm_ptx_verify::fence(&ptx).unwrap();
    let guarded = backend
        .load_fenced_ptx(&tenant, &fenced.ptx, "wild")
        .unwrap();
    let raw = backend.load_ptx(&tenant, &ptx, "wild").unwrap();
    let config = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
    };
    for offset in [1u64 << 20, u64::MAX - 3, 1 << 62, 4096 * 1024 + 8] {
        let args = [
            KernelArg::Buffer { offset: 0, len: 16 },
            KernelArg::U64(offset),
            KernelArg::U32(0xdead_beef),
        ];
        let mut memory = vec![0u8; 64 << 10];
        let run = |kernel, memory: &mut Vec<u8>| {
            launch(&*backend, &tenant, kernel, &config, &args, memory, |c| {
                c.wait_mut()
            })
            .and_then(|outcome| outcome)
        };
        run(&guarded, &mut memory).unwrap();
        let written = memory
            .chunks_exact(4)
            .filter(|w| *w == 0xdead_beef_u32.to_le_bytes())
            .count();
        assert_eq!(
            written, 1,
            "offset {offset:#x}: the fenced store lands in the window once"
        );
        let error = run(&raw, &mut vec![0u8; 64 << 10]).unwrap_err();
        assert!(
            error.to_string().contains("illegal address"),
            "offset {offset:#x}: {error}"
        );
    }
}

#[test]
fn a_spinning_fenced_kernel_ends_when_its_launch_is_cancelled() {
    let backend = cpu();
    let tenant = TenantKey::new("tn-spin");
    let fenced = tensor_wasm_ptx_verify::fence(&format!("{HEADER}{SPIN}")).unwrap();
    let kernel = backend
        .load_fenced_ptx(&tenant, &fenced.ptx, "spin")
        .unwrap();
    let config = LaunchConfig {
        grid: [4, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
    };
    let args = [KernelArg::Buffer { offset: 0, len: 4 }];
    let mut memory = vec![0u8; 64 << 10];
    let started = Instant::now();
    let outcome = launch(
        &*backend,
        &tenant,
        &kernel,
        &config,
        &args,
        &mut memory,
        |c| {
            std::thread::sleep(Duration::from_millis(200));
            assert!(!c.is_done(), "the kernel spins until it is cancelled");
            c.cancel();
            let cancelled = Instant::now();
            while !c.is_done() {
                assert!(
                    cancelled.elapsed() < Duration::from_secs(5),
                    "not ended 5 s after cancel"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            (cancelled.elapsed(), c.wait_mut())
        },
    )
    .unwrap();
    assert!(outcome.0 < Duration::from_secs(5));
    assert!(
        matches!(outcome.1, Err(GpuError::Cancelled(_))),
        "{:?}",
        outcome.1
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // Another tenant may not launch it.
    let other = TenantKey::new("tn-other");
    let refused = launch(
        &*backend,
        &other,
        &kernel,
        &config,
        &args,
        &mut memory,
        |c| c.wait_mut(),
    )
    .and_then(|outcome| outcome)
    .unwrap_err();
    assert!(matches!(refused, GpuError::InvalidArgument(_)), "{refused}");
}

#[test]
fn unfenced_text_is_refused_as_fenced() {
    let backend = cpu();
    let error = backend
        .load_fenced_ptx(&TenantKey::new("tn"), &format!("{HEADER}{SPIN}"), "spin")
        .unwrap_err();
    assert!(error.to_string().contains("not fenced"), "{error}");
}

/// In the interpreter directly: the fenced spin ends by its own poll (the launch returns
/// normally), where the unfenced one has to be ended by the interpreter's check.
#[test]
fn the_fenced_spin_ends_by_its_poll_and_the_plain_one_by_the_interpreter() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tensor_wasm_ptx_emu::{Allocation, CancelWord, EmuError, Launch, Module};

    const BASE: u64 = 1 << 40;
    const WORD: u64 = BASE - 4096;
    let plain = Module::parse(&format!("{HEADER}{SPIN}")).unwrap();
    let fenced = tensor_wasm_ptx_verify::fence(&format!("{HEADER}{SPIN}")).unwrap();
    let fenced = Module::parse(&fenced.ptx).unwrap();
    for (module, is_fenced) in [(&plain, false), (&fenced, true)] {
        let kernel = module.kernel("spin").unwrap();
        let mut values = vec![BASE.to_le_bytes().to_vec()];
        if is_fenced {
            let hidden = tensor_wasm_ptx_verify::hidden_args(BASE, BASE + 64, 16, WORD);
            values.extend(hidden.iter().map(|v| v.to_le_bytes().to_vec()));
        }
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let params = kernel.pack_params(&refs).unwrap();
        let flag = AtomicBool::new(false);
        let mut memory = [0u8; 64];
        let outcome = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                flag.store(true, Ordering::Release);
            });
            let mut config = Launch::new([2, 1, 1], [8, 1, 1], &params);
            config.dynamic_shared_bytes = if is_fenced { 16 } else { 0 };
            config.step_limit = u64::MAX;
            config.cancel = Some(CancelWord {
                address: WORD,
                flag: &flag,
            });
            let memory = &mut [Allocation {
                base: BASE,
                bytes: &mut memory,
            }];
            tensor_wasm_ptx_emu::launch(kernel, &config, memory)
        });
        if is_fenced {
            assert!(outcome.is_ok(), "fenced: {outcome:?}");
        } else {
            assert!(
                matches!(outcome, Err(EmuError::Cancelled { .. })),
                "plain: {outcome:?}"
            );
        }
    }
}
