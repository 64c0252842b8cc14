//! The host's cancel word: a running launch sees the host's write, a kernel that polls the
//! word ends by its own poll, one that never reads it is ended by the interpreter, and the
//! kernel cannot write the word.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tensor_wasm_ptx_emu::{launch, Allocation, CancelWord, EmuError, Launch, Module};

const OUT: u64 = 0x2000;
const WORD: u64 = 0x9000;

/// `k(p_out, p_cancel)`: `body` runs after `%rd1` = `p_out`, `%rd2` = `p_cancel`.
fn module(body: &str) -> Module {
    let ptx = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .entry k(.param .u64 p_out, .param .u64 p_cancel)\n{{\n\
         .reg .pred %p<4>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<8>;\n\
         ld.param.u64 %rd1, [p_out]; ld.param.u64 %rd2, [p_cancel];\n{body}\nret;\n}}\n"
    );
    Module::parse(&ptx).expect("the test kernel parses")
}

fn params(module: &Module) -> Vec<u8> {
    let kernel = module.kernel("k").unwrap();
    kernel
        .pack_params(&[&OUT.to_le_bytes(), &WORD.to_le_bytes()])
        .unwrap()
}

/// Runs `module` on one thread with the cancel word, the flag set by another thread after
/// `after`; what the launch returned, the output word, and how long it took.
fn run_cancelled_after(module: &Module, after: Duration) -> (Result<(), EmuError>, u32, Duration) {
    let flag = AtomicBool::new(false);
    let params = params(module);
    let mut out = [0u8; 4];
    let started = Instant::now();
    let result = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(after);
            flag.store(true, Ordering::Release);
        });
        let mut config = Launch::new([1, 1, 1], [1, 1, 1], &params);
        config.step_limit = u64::MAX;
        config.cancel = Some(CancelWord {
            address: WORD,
            flag: &flag,
        });
        let kernel = module.kernel("k").unwrap();
        launch(
            kernel,
            &config,
            &mut [Allocation {
                base: OUT,
                bytes: &mut out,
            }],
        )
        .map(|_| ())
    });
    (result, u32::from_le_bytes(out), started.elapsed())
}

#[test]
fn a_polling_kernel_sees_the_host_write_and_ends_by_its_own_poll() {
    // Counts loop iterations until the word reads non-zero, then stores the count.
    let spin = module(
        "mov.u32 %r1, 0;\n\
         LOOP: add.u32 %r1, %r1, 1;\n\
         ld.volatile.global.u32 %r2, [%rd2];\n\
         setp.eq.u32 %p1, %r2, 0;\n\
         @%p1 bra LOOP;\n\
         st.global.u32 [%rd1], %r1;",
    );
    let (result, count, took) = run_cancelled_after(&spin, Duration::from_millis(50));
    assert_eq!(
        result,
        Ok(()),
        "the kernel's own poll ends it, not the interpreter"
    );
    assert!(
        count > 1,
        "the word read 0 until the host wrote it: {count} iterations"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_kernel_that_never_reads_the_word_is_ended_by_the_interpreter() {
    let spin = module("LOOP: add.u32 %r1, %r1, 1;\nbra LOOP;");
    let (result, _, took) = run_cancelled_after(&spin, Duration::from_millis(50));
    match result {
        Err(EmuError::Cancelled { at }) => assert_eq!(at.kernel, "k"),
        other => panic!("expected a cancelled launch, got {other:?}"),
    }
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn the_word_is_read_only_and_reads_as_a_u32() {
    let write = module("mov.u32 %r1, 7;\nst.global.u32 [%rd2], %r1;");
    let flag = AtomicBool::new(true);
    let params = params(&write);
    let mut out = [0u8; 4];
    let mut config = Launch::new([1, 1, 1], [1, 1, 1], &params);
    config.cancel = Some(CancelWord {
        address: WORD,
        flag: &flag,
    });
    let memory = &mut [Allocation {
        base: OUT,
        bytes: &mut out,
    }];
    let error = launch(write.kernel("k").unwrap(), &config, memory).unwrap_err();
    assert!(
        matches!(error, EmuError::IllegalAddress { address: WORD, .. }),
        "{error}"
    );

    // Set before the launch: a byte and the word read what the host wrote.
    let read = module(
        "ld.global.u32 %r1, [%rd2]; ld.global.u8 %r2, [%rd2+1];\n\
         shl.b32 %r2, %r2, 8; or.b32 %r1, %r1, %r2; st.global.u32 [%rd1], %r1;",
    );
    let params = self::params(&read);
    let mut config = Launch::new([1, 1, 1], [1, 1, 1], &params);
    config.cancel = Some(CancelWord {
        address: WORD,
        flag: &flag,
    });
    launch(
        read.kernel("k").unwrap(),
        &config,
        &mut [Allocation {
            base: OUT,
            bytes: &mut out,
        }],
    )
    .unwrap();
    assert_eq!(u32::from_le_bytes(out), 1);
}

#[test]
fn a_cancel_word_inside_an_allocation_or_misaligned_is_refused() {
    let spin = module("ret;");
    let flag = AtomicBool::new(false);
    let params = params(&spin);
    let mut out = [0u8; 4];
    for address in [OUT, WORD + 2] {
        let mut config = Launch::new([1, 1, 1], [1, 1, 1], &params);
        config.cancel = Some(CancelWord {
            address,
            flag: &flag,
        });
        let error = launch(
            spin.kernel("k").unwrap(),
            &config,
            &mut [Allocation {
                base: OUT,
                bytes: &mut out,
            }],
        )
        .unwrap_err();
        assert!(matches!(error, EmuError::InvalidLaunch { .. }), "{error}");
    }
}
