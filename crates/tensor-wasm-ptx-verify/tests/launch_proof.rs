//! The launch-time proof on small hand-written kernels: what it admits, what it refuses,
//! and that each refusal names the instruction's line and why. (The corpus, the mutants and
//! the fuzz test check it against execution.)

use tensor_wasm_ptx_verify::{fence, LaunchFacts, Plan, PROOF_STEPS};

const BASE: u64 = 1 << 40;
const WINDOW: u64 = 4096;

fn module(params: &str, body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\n\
         .shared .align 4 .b8 tile[256];\n\n\
         .func (.param .b64 pick_ret) pick(.param .b64 pick_p)\n{{\n\
         \t.reg .b64 %q<2>;\n\tld.param.u64 %q1, [pick_p];\n\tst.param.b64 [pick_ret], %q1;\n\tret;\n}}\n\n\
         .visible .entry k({params})\n{{\n\
         \t.reg .pred %p<4>;\n\t.reg .b32 %r<9>;\n\t.reg .b64 %rd<9>;\n{body}\n}}\n"
    )
}

/// A guarded store of `out[i]` for the global index `i < n`.
const STORE: &str = "\tld.param.u64 %rd1, [out];\n\tld.param.u32 %r1, [n];\n\
    \tmov.u32 %r2, %ctaid.x;\n\tmov.u32 %r3, %ntid.x;\n\tmov.u32 %r4, %tid.x;\n\
    \tmad.lo.s32 %r5, %r2, %r3, %r4;\n\tsetp.ge.u32 %p1, %r5, %r1;\n\t@%p1 bra DONE;\n\
    \tmul.wide.u32 %rd2, %r5, 4;\n\tadd.s64 %rd3, %rd1, %rd2;\n\tst.global.u32 [%rd3], %r5;\n\
    DONE:\n\tret;";

fn plan_of(ptx: &str) -> Plan {
    let fenced = fence(ptx).unwrap_or_else(|refusal| panic!("{refusal}\n{ptx}"));
    Plan::new(&fenced.ptx, "k").expect("a lean copy")
}

fn facts<'a>(params: &'a [Vec<u8>], block: u32) -> LaunchFacts<'a> {
    LaunchFacts {
        params,
        grid: [4, 1, 1],
        block: [block, 1, 1],
        dynamic_shared: 16,
        window: (BASE, BASE + WINDOW),
    }
}

fn store_params(out: u64, n: u32) -> Vec<Vec<u8>> {
    vec![out.to_le_bytes().to_vec(), n.to_le_bytes().to_vec()]
}

#[test]
fn a_guarded_store_is_proven_exactly_when_its_parameters_keep_it_inside() {
    let plan = plan_of(&module(".param .u64 out, .param .u32 n", STORE));
    assert_eq!(plan.lean_entry(), "__tw_lean_k");
    // 1024 words fill the window; the grid has 4 × 256 threads.
    let fits = store_params(BASE, 1024);
    let proof = plan.admit(&facts(&fits, 256)).expect("proven");
    assert_eq!(proof.rounds, 0);
    // One word more would be written past the window's end.
    let over = store_params(BASE + 4, 1024);
    let refusal = plan.admit(&facts(&over, 256)).unwrap_err();
    assert!(refusal.reason.contains("outside its memory"), "{refusal}");
    assert!(refusal.line > 0);
    // ... unless the grid has fewer threads than `n`.
    assert!(plan.admit(&facts(&over, 128)).is_ok());
    // A misaligned buffer: the 4-byte stores are not aligned.
    let misaligned = store_params(BASE + 2, 16);
    let refusal = plan.admit(&facts(&misaligned, 32)).unwrap_err();
    assert!(refusal.reason.contains("aligned"), "{refusal}");
    // A buffer outside the window altogether.
    let outside = store_params(BASE - 4096, 16);
    assert!(plan.admit(&facts(&outside, 32)).is_err());
}

#[test]
fn a_check_of_another_register_does_not_bound_the_address() {
    // 512 words from the window's middle: the 1024 threads need the guard on their index.
    let params = store_params(BASE + WINDOW / 2, 512);
    let guarded = plan_of(&module(".param .u64 out, .param .u32 n", STORE));
    assert!(guarded.admit(&facts(&params, 256)).is_ok());
    // The same guard on the block index instead.
    let body = STORE.replace("setp.ge.u32 %p1, %r5, %r1", "setp.ge.u32 %p1, %r2, %r1");
    let plan = plan_of(&module(".param .u64 out, .param .u32 n", &body));
    assert!(plan.admit(&facts(&params, 256)).is_err());
}

#[test]
fn an_index_that_may_wrap_is_not_proven() {
    // i + 2^31 − 1 wraps to a negative 32-bit index for every thread but the first.
    let body = STORE.replace(
        "\tmul.wide.u32 %rd2, %r5, 4;",
        "\tadd.s32 %r6, %r4, 2147483647;\n\tmul.wide.s32 %rd2, %r6, 4;",
    );
    let plan = plan_of(&module(".param .u64 out, .param .u32 n", &body));
    let params = store_params(BASE, 1024);
    assert!(plan.admit(&facts(&params, 256)).is_err());
}

#[test]
fn shared_accesses_are_proven_against_their_variable() {
    let body = "\tmov.u32 %r1, %tid.x;\n\tmul.wide.u32 %rd1, %r1, 4;\n\tmov.u64 %rd2, tile;\n\
        \tadd.s64 %rd3, %rd2, %rd1;\n\tst.shared.u32 [%rd3], %r1;\n\tret;";
    let plan = plan_of(&module("", body));
    assert!(
        plan.admit(&facts(&[], 64)).is_ok(),
        "64 words fill the tile"
    );
    let refusal = plan.admit(&facts(&[], 65)).unwrap_err();
    assert!(refusal.reason.contains("shared"), "{refusal}");
}

#[test]
fn a_loop_without_a_bound_exhausts_the_budget() {
    let body = "\tmov.u32 %r1, 0;\nSPIN:\n\tadd.s32 %r1, %r1, 1;\n\tbra SPIN;";
    let plan = plan_of(&module("", body));
    let refusal = plan.admit(&facts(&[], 32)).unwrap_err();
    assert!(
        refusal.reason.contains(&PROOF_STEPS.to_string()),
        "{refusal}"
    );
}

#[test]
fn a_counted_loop_unrolls_and_is_proven() {
    // for (j = 0; j < 8; j++) out[j * 4 + tid] = j, with 4 threads: 32 words.
    let body = "\tld.param.u64 %rd1, [out];\n\tmov.u32 %r4, %tid.x;\n\tmov.u32 %r1, 0;\n\
        LOOP:\n\tshl.b32 %r2, %r1, 2;\n\tadd.s32 %r3, %r2, %r4;\n\tmul.wide.u32 %rd2, %r3, 4;\n\
        \tadd.s64 %rd3, %rd1, %rd2;\n\tst.global.u32 [%rd3], %r1;\n\tadd.s32 %r1, %r1, 1;\n\
        \tsetp.lt.u32 %p1, %r1, 8;\n\t@%p1 bra LOOP;\n\tret;";
    let plan = plan_of(&module(".param .u64 out", body));
    let inside = vec![(BASE + WINDOW - 128).to_le_bytes().to_vec()];
    let proof = plan.admit(&facts(&inside, 4)).expect("proven");
    assert_eq!(proof.rounds, 7);
    let past = vec![(BASE + WINDOW - 124).to_le_bytes().to_vec()];
    assert!(plan.admit(&facts(&past, 4)).is_err());
}

#[test]
fn a_call_argument_is_never_taken_from_an_earlier_call() {
    // The first call passes `out`; the second declares its argument afresh and never writes
    // it, so the pointer it returns is unknown, and the store through it is not proven.
    let call = |store: &str| {
        format!(
            "\t{{\n\t.param .b64 a;\n{store}\t.param .b64 r;\n\tcall.uni (r), pick, (a);\n\
             \tld.param.u64 %rd2, [r];\n\t}}\n"
        )
    };
    let body = format!(
        "\tld.param.u64 %rd1, [out];\n{}\tst.global.u32 [%rd2], %r1;\n{}\tst.global.u32 [%rd2], %r1;\n\tret;",
        call("\tst.param.b64 [a], %rd1;\n"),
        call(""),
    );
    let plan = plan_of(&module(".param .u64 out", &body));
    let params = vec![BASE.to_le_bytes().to_vec()];
    let refusal = plan.admit(&facts(&params, 4)).unwrap_err();
    assert!(refusal.reason.contains("cannot bound"), "{refusal}");
    // With the second call's argument written too, both stores are proven.
    let body = body.replacen(
        "\t.param .b64 r;\n\tcall.uni (r), pick, (a);\n\tld.param.u64 %rd2, [r];\n\t}\n\tst.global.u32 [%rd2], %r1;\n\tret;",
        "\tst.param.b64 [a], %rd1;\n\t.param .b64 r;\n\tcall.uni (r), pick, (a);\n\tld.param.u64 %rd2, [r];\n\t}\n\tst.global.u32 [%rd2], %r1;\n\tret;",
        1,
    );
    let plan = plan_of(&module(".param .u64 out", &body));
    assert!(plan.admit(&facts(&params, 4)).is_ok());
}

#[test]
fn a_looping_launch_too_large_to_run_without_polls_is_not_proven() {
    let body = "\tmov.u32 %r1, 0;\nLOOP:\n\tadd.s32 %r1, %r1, 1;\n\tsetp.lt.u32 %p1, %r1, 8;\n\
        \t@%p1 bra LOOP;\n\tret;";
    let plan = plan_of(&module("", body));
    let small = plan.admit(&facts(&[], 32)).expect("proven");
    assert_eq!(small.rounds, 7);
    assert!(small.longest >= 8 * 3, "{small:?}");
    let huge = LaunchFacts {
        grid: [1 << 20, 1 << 10, 1],
        block: [1024, 1, 1],
        ..facts(&[], 32)
    };
    let refusal = plan.admit(&huge).unwrap_err();
    assert!(
        refusal.reason.contains("without cancellation polls"),
        "{refusal}"
    );
}
