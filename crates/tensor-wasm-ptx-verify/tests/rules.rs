//! The verifier's rules one at a time on small kernels, and every blueprint of the
//! conformance set fenced: the same bytes as the blueprint's own PTX on its fixed cases.

mod common;

use tensor_wasm_jit::conformance::{blueprints, build, fixed_cases};
use tensor_wasm_jit::PtxTarget;
use tensor_wasm_ptx_emu::{Module, Schedule};
use tensor_wasm_ptx_verify::fence;

use common::{pack, run_launch, Launched, Mode};

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// A kernel with shared memory whose barrier sits where `placement` puts it.
fn kernel(body: &str) -> String {
    format!(
        "{HEADER}.shared .align 4 .b8 buf[512];\n\
         .visible .entry k(.param .u64 p_out, .param .u32 p_n)\n{{\n\
         .reg .pred %p<4>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<8>;\n\
         ld.param.u64 %rd1, [p_out];\nld.param.u32 %r5, [p_n];\nmov.u32 %r1, %tid.x;\n\
         {body}\nret;\n}}\n"
    )
}

#[test]
fn a_barrier_only_some_threads_reach_is_refused_with_the_branch_line() {
    // The branch depends on the thread index: threads 0..31 skip the barrier.
    let divergent = kernel(
        "setp.lt.u32 %p1, %r1, 32;\n@%p1 bra DONE;\nbar.sync 0;\nDONE:\nst.global.u32 [%rd1], %r1;",
    );
    let refusal = fence(&divergent).unwrap_err();
    assert!(refusal.instruction.starts_with("bar.sync"), "{refusal}");
    assert!(refusal.reason.contains("line 14"), "{refusal}");
    // Data that flows from %tid makes a branch divergent too, through any arithmetic.
    let through_data = kernel(
        "add.u32 %r2, %r1, 7;\nshl.b32 %r3, %r2, 1;\nsetp.eq.u32 %p1, %r3, 0;\n\
         @%p1 bra DONE;\nbar.sync 0;\nDONE:\nret;",
    );
    assert!(fence(&through_data).is_err());
    // A loop whose trip count differs between threads, with a barrier inside.
    let divergent_loop = kernel(
        "mov.u32 %r2, 0;\nLOOP:\nbar.sync 0;\nadd.u32 %r2, %r2, 1;\n\
         setp.lt.u32 %p1, %r2, %r1;\n@%p1 bra LOOP;",
    );
    assert!(fence(&divergent_loop).is_err());
    // Returning early before a barrier: the barrier is divergent.
    let early_exit = kernel("setp.ge.u32 %p1, %r1, %r5;\n@%p1 ret;\nbar.sync 0;");
    assert!(fence(&early_exit).is_err());
}

#[test]
fn barriers_every_thread_reaches_are_accepted() {
    // A branch on a parameter is the same in every thread.
    let uniform = kernel(
        "setp.eq.u32 %p1, %r5, 0;\n@%p1 bra DONE;\nbar.sync 0;\nDONE:\nst.global.u32 [%rd1], %r1;",
    );
    fence(&uniform).unwrap();
    // A divergent branch that joins before the barrier.
    let joined = kernel(
        "setp.lt.u32 %p1, %r1, 32;\n@%p1 bra SKIP;\nadd.u32 %r2, %r1, 1;\nSKIP:\nbar.sync 0;",
    );
    fence(&joined).unwrap();
    // A loop counted by a parameter, with a barrier inside.
    let counted = kernel(
        "mov.u32 %r2, 0;\nLOOP:\nbar.sync 0;\nadd.u32 %r2, %r2, 1;\n\
         setp.lt.u32 %p1, %r2, %r5;\n@%p1 bra LOOP;",
    );
    let fenced = fence(&counted).unwrap();
    assert_eq!(fenced.polls, 1, "the back-edge polls the cancel word");
}

#[test]
fn constant_accesses_outside_their_variable_are_refused() {
    // The two parameter loads and the store are proven in bounds.
    let inside = kernel("st.shared.u32 [buf+508], %r1;");
    assert_eq!(fence(&inside).unwrap().proven, 3);
    for outside in [
        "st.shared.u32 [buf+510], %r1;",
        "st.shared.u32 [buf+512], %r1;",
        "ld.param.u32 %r2, [p_n+4];",
    ] {
        let refusal = fence(&kernel(outside)).unwrap_err();
        assert!(refusal.reason.contains("outside the variable"), "{refusal}");
    }
}

#[test]
fn every_blueprint_gives_the_same_bytes_fenced() {
    let mut kernels = 0;
    let mut lean = 0u32;
    for blueprint in blueprints() {
        let ptx = blueprint.emit_ptx(&PtxTarget::default());
        let fenced = fence(&ptx).unwrap_or_else(|refusal| panic!("{blueprint}: {refusal}"));
        let entry = blueprint.entry_name();
        let plain = Module::parse(&ptx).unwrap();
        let guarded = Module::parse(&fenced.ptx).unwrap();
        let plan = tensor_wasm_ptx_verify::Plan::new(&fenced.ptx, &entry)
            .unwrap_or_else(|| panic!("{blueprint}: no lean copy"));
        for case in fixed_cases(&blueprint, 1) {
            let (config, args, layout) = build(&blueprint, &case);
            let args = pack(&args);
            let launch = Launched {
                entry: &entry,
                plan: Some(&plan),
                config: &config,
                args: &args,
                memory: &layout.memory,
            };
            for schedule in Schedule::ALL {
                let a = run_launch(&plain, &launch, Mode::Plain, schedule)
                    .unwrap_or_else(|e| panic!("{blueprint} {schedule:?}: {e}"));
                let b = run_launch(&guarded, &launch, Mode::Fenced, schedule)
                    .unwrap_or_else(|e| panic!("{blueprint} fenced {schedule:?}: {e}"));
                assert!(
                    a.memory == b.memory,
                    "{blueprint} {schedule:?}: fenced and unfenced differ"
                );
                let c = run_launch(&guarded, &launch, Mode::Checked, schedule)
                    .unwrap_or_else(|e| panic!("{blueprint} checked {schedule:?}: {e}"));
                assert!(
                    a.memory == c.memory,
                    "{blueprint} {schedule:?}: the checked launch differs"
                );
                lean += u32::from(c.lean && schedule == Schedule::InOrder);
            }
        }
        kernels += 1;
    }
    println!("{lean} blueprint launches of {kernels} blueprints proven (lean)");
    assert!(kernels >= 100, "{kernels} blueprints");
}

/// The rewrite's own names are reserved: a tenant register declared in an inner scope with
/// the name of a fence's bound would shadow it there and turn the fence off.
#[test]
fn names_the_rewrite_uses_are_refused() {
    let shadowing =
        kernel("{\n.reg .b64 %tw_top4;\nmov.u64 %tw_top4, -1;\nst.global.u32 [%rd1+64], %r1;\n}");
    let refusal = fence(&shadowing).unwrap_err();
    assert_eq!(refusal.instruction, "%tw_top4", "{refusal}");
    assert!(refusal.reason.contains("reserved"), "{refusal}");
    assert_eq!(refusal.line, 14, "{refusal}");

    let param = format!("{HEADER}.visible .entry k(.param .u64 __tw_lo)\n{{\nret;\n}}\n");
    assert_eq!(fence(&param).unwrap_err().instruction, "__tw_lo");
    // An ordinary kernel is accepted.
    let fine = kernel("mov.u32 %r2, %r1;\nst.global.u32 [%rd1], %r2;");
    fence(&fine).unwrap();
}
