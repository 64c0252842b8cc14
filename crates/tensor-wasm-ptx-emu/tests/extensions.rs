//! The interpreter's extensions on small hand-written kernels: atomics, generic addressing,
//! `.local` memory, device functions and calls, f64, `.ftz` f32, warp shuffles, predicate
//! logic. Every expected value is computed here in plain Rust, never by the interpreter.

use tensor_wasm_ptx_emu::{launch, Allocation, EmuError, Launch, Module, Schedule};

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";
const IN: u64 = 0x1000;
const OUT: u64 = 0x2000;

/// `%rd1`, `%rd2` = `p_in`, `p_out`; `%r1`, `%r3` = `%tid.x`, `%ntid.x`; `%r2` = the global
/// thread index; `%rd3` = `&out[%r2]`.
const PROLOGUE: &str = ".reg .pred %p<16>;\n.reg .b32 %r<32>;\n.reg .b64 %rd<32>;\n\
    ld.param.u64 %rd1, [p_in]; ld.param.u64 %rd2, [p_out]; mov.u32 %r1, %tid.x;\n\
    mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mad.lo.u32 %r2, %r2, %r3, %r1;\n\
    mul.wide.u32 %rd3, %r2, 4; add.u64 %rd3, %rd2, %rd3;\n";

/// `%r10` = `in[%r2]`.
const LOAD_X: &str =
    "mul.wide.u32 %rd10, %r2, 4; add.u64 %rd10, %rd1, %rd10; ld.global.u32 %r10, [%rd10];\n";

/// The entry `k(p_in, p_out)`: [`PROLOGUE`], then `body` (declarations may open it).
fn entry(body: &str) -> String {
    let params = "(.param .u64 p_in, .param .u64 p_out)";
    format!(".visible .entry k{params}\n{{\n{PROLOGUE}{body}\nret;\n}}\n")
}

fn words(bytes: &[u8]) -> Vec<u32> {
    let word = |w: &[u8]| u32::from_le_bytes(w.try_into().unwrap());
    bytes.chunks_exact(4).map(word).collect()
}

fn dword(words: &[u32], i: usize) -> u64 {
    u64::from(words[i]) | (u64::from(words[i + 1]) << 32)
}

fn halves(values: &[u64]) -> Vec<u32> {
    let split = |&v: &u64| [v as u32, (v >> 32) as u32];
    values.iter().flat_map(split).collect()
}

/// `f(0), f(1), ..., f(n - 1)`, flattened.
fn seq<const K: usize>(n: u32, f: impl Fn(u32) -> [u32; K]) -> Vec<u32> {
    (0..n).flat_map(f).collect()
}

fn alloc(base: u64, bytes: &mut [u8]) -> Allocation<'_> {
    Allocation { base, bytes }
}

/// Memory after a launch: the input words, the output words.
type Mem = (Vec<u32>, Vec<u32>);

/// Runs the entry of `ptx` on `dims[0]` blocks of `dims[1..]` threads, `input` at [`IN`]
/// and `n` zero words at [`OUT`].
fn run(ptx: &str, dims: [u32; 4], s: Schedule, input: &[u32], n: usize) -> Result<Mem, EmuError> {
    let module = Module::parse(&format!("{HEADER}{ptx}"))?;
    let kernel = module.kernels().first().expect("an entry");
    let params = kernel.pack_params(&[&IN.to_le_bytes(), &OUT.to_le_bytes()])?;
    let [grid, block @ ..] = dims;
    let mut config = Launch::new([grid, 1, 1], block, &params).schedule(s);
    config.step_limit = 200_000;
    let mut input: Vec<u8> = input.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut out = vec![0u8; 4 * n];
    let memory = &mut [alloc(IN, &mut input), alloc(OUT, &mut out)];
    launch(kernel, &config, memory)?;
    Ok((words(&input), words(&out)))
}

/// [`run`], which must succeed.
fn ok(ptx: &str, dims: [u32; 4], s: Schedule, input: &[u32], n: usize) -> Mem {
    run(ptx, dims, s, input, n).unwrap_or_else(|e| panic!("{s:?}: {e}\n{ptx}"))
}

/// [`run`] under every schedule: each must succeed and write exactly `expected`.
fn expect(ptx: &str, dims: [u32; 4], input: &[u32], expected: &[u32]) {
    for s in Schedule::ALL {
        assert_eq!(ok(ptx, dims, s, input, expected.len()).1, expected, "{s:?}");
    }
}

/// One thread of `entry(body)`.
fn one(body: &str, input: &[u32], n: usize) -> Mem {
    ok(&entry(body), [1; 4], Schedule::InOrder, input, n)
}

/// One thread of `entry(body)`: it succeeds if `legal`, else fails with an illegal address.
fn bounded(body: &str, legal: bool) {
    let result = run(&entry(body), [1; 4], Schedule::InOrder, &[0; 4], 0).map(drop);
    let outcome = result.map_err(|e| matches!(e, EmuError::IllegalAddress { .. }));
    assert_eq!(outcome, if legal { Ok(()) } else { Err(true) }, "{body}");
}

fn f(x: f32) -> u32 {
    x.to_bits()
}

/// A number as the tables write it: decimal (maybe negative) or `0x` hex.
fn num(text: &str) -> i64 {
    let hex = text.strip_prefix("0x").map(|h| i64::from_str_radix(h, 16));
    hex.unwrap_or_else(|| text.parse()).unwrap()
}

/// 192 threads add to global counters (u32 and u64 `atom`, u32 `red`): exact totals, and the
/// u32 adds' old values are each count in between once, under every schedule.
#[test]
fn global_atomic_adds_from_many_threads_lose_no_update() {
    let body = "atom.global.add.u32 %r10, [%rd1], 1; st.global.u32 [%rd3], %r10; \
                add.u32 %r11, %r2, 1; cvt.u64.u32 %rd10, %r11; \
                atom.global.add.u64 %rd11, [%rd1+8], %rd10; red.global.add.u32 [%rd1+4], 2;";
    let (start, sum) = (0xffff_fff0u64, (1..=192u64).sum::<u64>());
    let input = [1000, 7, start as u32, 0];
    for s in Schedule::ALL {
        let (memory, mut olds) = ok(&entry(body), [2, 96, 1, 1], s, &input, 192);
        assert_eq!(memory[..2], [1000 + 192, 7 + 2 * 192], "{s:?}");
        assert_eq!(dword(&memory, 2), start + sum, "{s:?}");
        olds.sort_unstable();
        assert_eq!(olds, (1000..1192).collect::<Vec<u32>>(), "{s:?}");
    }
}

/// 96 threads `atom.shared.add` 3 to one word in one barrier interval, then `red.shared.add` 5
/// in the next: no race, exact totals, old values exactly {0, 3, ..., 3 * 95}, every schedule.
#[test]
fn shared_atomic_adds_count_exactly_and_are_not_races() {
    let body = ".shared .align 4 .b32 count;\n\
                setp.eq.u32 %p1, %r1, 0; mov.u32 %r10, 0; @%p1 st.shared.u32 [count], %r10; \
                bar.sync 0; atom.shared.add.u32 %r11, [count], 3; st.global.u32 [%rd3+4], %r11; \
                bar.sync 0; red.shared.add.u32 [count], 5; bar.sync 0; \
                @%p1 ld.shared.u32 %r12, [count]; @%p1 st.global.u32 [%rd2], %r12;";
    for s in Schedule::ALL {
        let (_, out) = ok(&entry(body), [1, 96, 1, 1], s, &[], 97);
        assert_eq!(out[0], (3 + 5) * 96, "{s:?}");
        let mut olds = out[1..].to_vec();
        olds.sort_unstable();
        assert_eq!(olds, seq(96, |i| [3 * i]), "{s:?}");
    }
}

/// Each atomic operation on its own 8-byte slot: `d` is the old value and the slot holds the
/// hand-computed new one (32-bit ones leave the upper half alone); float atomics are refused.
#[test]
fn each_atomic_operation_returns_the_old_value_and_stores_the_new_one() {
    // Operation, old value, b, c (cas only), new value, wrapped to the operation's width.
    let table = "cas.b32 5 5 9 9, cas.b32 6 5 9 6, exch.b32 7 11 0 11, \
                 inc.u32 4 4 0 0, inc.u32 9 4 0 0, inc.u32 2 4 0 3, \
                 dec.u32 0 4 0 4, dec.u32 9 4 0 4, dec.u32 3 4 0 2, \
                 min.s32 -5 3 0 -5, max.s32 -5 3 0 3, min.u32 -5 3 0 3, max.u32 1 -16 0 -16, \
                 and.b32 12 10 0 8, or.b32 12 10 0 14, xor.b32 12 10 0 6, \
                 add.u32 -1 2 0 1, add.s32 3 -5 0 -2, relaxed.gpu.add.u32 40 2 0 42, \
                 acq_rel.sys.exch.b32 1 2 0 2, acquire.cta.max.s32 -5 -7 0 -5, \
                 release.gpu.or.b32 1 6 0 7, add.u64 0xffffffff 2 0 0x100000001, \
                 add.s64 -1 -1 0 -2, min.s64 -5 3 0 -5, max.u64 -5 3 0 -5, \
                 cas.b64 0x10000000000 0x10000000000 3 3, exch.b64 0x10000000000 7 0 7";
    let (mut cases, mut body) = (Vec::new(), String::new());
    for (i, case) in table.split(", ").enumerate() {
        let fields: Vec<&str> = case.split(' ').collect();
        let (op, wide) = (fields[0], fields[0].ends_with("64"));
        let mask = if wide { u64::MAX } else { 0xffff_ffff };
        let [old, new] = [1, 4].map(|k| num(fields[k]) as u64 & mask);
        let (d, ty) = [("%r10", "b32"), ("%rd10", "b64")][usize::from(wide)];
        // The operands as written (negative ones wrap to the width, as in NVRTC's `-1`).
        let (at, end) = (8 * i, 3 + usize::from(op.starts_with("cas")));
        let operands = fields[2..end].join(", ");
        body += &format!("atom.global.{op} {d}, [%rd1+{at}], {operands};\n");
        body += &format!("st.global.{ty} [%rd2+{at}], {d};\n");
        cases.push((op, old, new));
    }
    let initial: Vec<u64> = cases.iter().map(|case| case.1).collect();
    let (memory, out) = one(&body, &halves(&initial), 2 * cases.len());
    for (i, (op, old, new)) in cases.into_iter().enumerate() {
        assert_eq!(dword(&out, 2 * i), old, "{op}: the old value");
        assert_eq!(dword(&memory, 2 * i), new, "{op}: the new value");
    }
    let float = entry("atom.global.add.f32 %r10, [%rd1], %r11;");
    let error = Module::parse(&format!("{HEADER}{float}")).unwrap_err();
    assert!(matches!(error, EmuError::Unsupported { .. }), "{error}");
}

/// Generic accesses reach shared memory through `cvta.shared` (undone by `cvta.to.shared`) and
/// global memory (`cvta.global`: the identity), and fault one word past either's end.
#[test]
fn generic_addresses_reach_shared_and_global_memory_and_no_further() {
    let body = ".shared .align 8 .b8 pad[24];\n.shared .align 4 .b32 sbuf[4];\n\
                mov.u64 %rd10, sbuf; cvta.shared.u64 %rd11, %rd10; mov.u32 %r10, 77; \
                st.u32 [%rd11+4], %r10; ld.shared.u32 %r11, [sbuf+4]; st.global.u32 [%rd2], %r11; \
                mov.u32 %r12, 88; st.shared.u32 [%rd10+8], %r12; ld.u32 %r13, [%rd11+8]; \
                st.global.u32 [%rd2+4], %r13; atom.add.u32 %r14, [%rd11+8], 5; \
                st.global.u32 [%rd2+8], %r14; ld.shared.u32 %r15, [sbuf+8]; \
                st.global.u32 [%rd2+12], %r15; add.u64 %rd12, %rd10, 8; \
                cvta.shared.u64 %rd13, %rd12; cvta.to.shared.u64 %rd14, %rd13; \
                st.global.u64 [%rd2+16], %rd14;";
    let (_, out) = one(body, &[], 6);
    assert_eq!(out[..4], [77, 88, 88, 93]);
    // `sbuf` is 24 bytes into the block's shared memory (after `pad`), which starts at
    // SHARED_BASE: cvta.to.shared(cvta.shared(sbuf + 8)).
    assert_eq!(dword(&out, 4), tensor_wasm_ptx_emu::SHARED_BASE + 32);
    for (offset, legal) in [(12, true), (16, false)] {
        let shared = ".shared .align 4 .b32 s[4];\nmov.u64 %rd10, s; cvta.shared.u64 %rd11, %rd10;";
        let access = format!("st.u32 [%rd11+{offset}], %r1; ld.u32 %r10, [%rd11+{offset}];");
        bounded(&format!("{shared}\n{access}"), legal);
    }
    let global = "cvta.global.u64 %rd10, %rd1; cvta.to.global.u64 %rd11, %rd1; \
                  st.global.u64 [%rd2], %rd10; st.global.u64 [%rd2+8], %rd11; \
                  ld.u32 %r10, [%rd10+8]; st.global.u32 [%rd2+16], %r10; \
                  atom.add.u32 %r11, [%rd11], 1; st.global.u32 [%rd2+20], %r11;";
    let body = |offset: u32| format!("{global} st.u32 [%rd10+{offset}], %r10;");
    let (memory, out) = one(&body(12), &[10, 20, 30, 40], 6);
    assert_eq!([dword(&out, 0), dword(&out, 2)], [IN, IN]);
    assert_eq!([out[4], out[5]], [30, 10]);
    assert_eq!(memory, [11, 20, 30, 30]);
    let error = run(&entry(&body(16)), [1; 4], Schedule::InOrder, &[0; 4], 6).unwrap_err();
    let fault = matches!(error, EmuError::IllegalAddress { address, .. } if address == IN + 16);
    assert!(fault, "{error}");
}

/// The `.local` depot NVRTC declares, addressed as `%SPL` (local) and `%SP` (generic).
const DEPOT: &str = ".local .align 4 .b8 __local_depot0[32];\n.reg .b64 %SPL;\n.reg .b64 %SP;\n\
                     mov.u64 %SPL, __local_depot0; cvta.local.u64 %SP, %SPL;\n";

/// Each thread's local memory is its own (what it stores before a barrier it reads back after,
/// under every schedule); one word past the 32 declared bytes is an illegal address.
#[test]
fn local_memory_is_private_to_each_thread_and_bounded() {
    let body = format!(
        "{DEPOT}st.local.u32 [%SPL+4], %r2; mul.lo.u32 %r10, %r2, 7; st.u32 [%SP+8], %r10; \
         bar.sync 0; ld.local.u32 %r11, [%SPL+4]; ld.u32 %r12, [%SP+4]; \
         ld.local.u32 %r13, [%SPL+8]; cvta.to.local.u64 %rd10, %SP; \
         ld.local.u32 %r14, [%rd10+8]; mul.wide.u32 %rd11, %r2, 16; add.u64 %rd11, %rd2, %rd11; \
         st.global.v4.u32 [%rd11], {{%r11, %r12, %r13, %r14}};"
    );
    let expected = seq(64, |g| [g, g, 7 * g, 7 * g]);
    expect(&entry(&body), [2, 32, 1, 1], &[], &expected);
    for access in [
        "st.local.u32 [%SPL+28], %r1; ld.local.u32 %r10, [%SPL+28];",
        "st.u32 [%SP+28], %r1; ld.u32 %r10, [%SP+28];",
        "st.local.u32 [%SPL+32], %r1;",
        "ld.local.u32 %r10, [%SPL+32];",
        "st.u32 [%SP+32], %r1;",
    ] {
        bounded(&format!("{DEPOT}{access}"), !access.contains("+32"));
    }
}

/// A `.func` `name` returning a `.b32`, with `n` `.b32` parameters `name_param_i`.
fn func(name: &str, n: usize, body: &str) -> String {
    let param = |i: usize| format!(".param .b32 {name}_param_{i}");
    let params = (0..n).map(param).collect::<Vec<_>>().join(", ");
    format!(".func (.param .b32 func_retval0) {name}({params})\n{{\n{body}\nret;\n}}\n")
}

/// An NVRTC call sequence: `.param`s for the arguments (`.b64` for `%rd` registers), `call.uni`
/// and the `.b32` result loaded into `result`.
fn call(name: &str, args: &[&str], result: Option<&str>) -> String {
    let mut text = String::from("{\n");
    for (i, arg) in args.iter().enumerate() {
        let bits = if arg.starts_with("%rd") { 64 } else { 32 };
        text += &format!(".param .b{bits} param{i};\nst.param.b{bits} [param{i}+0], {arg};\n");
    }
    let params: Vec<String> = (0..args.len()).map(|i| format!("param{i}")).collect();
    let params = params.join(", ");
    text += &match result {
        Some(reg) => format!(
            ".param .b32 retval0;\ncall.uni (retval0), {name}, ({params});\n\
             ld.param.b32 {reg}, [retval0+0];\n"
        ),
        None => format!("call.uni {name}, ({params});\n"),
    };
    text + "}\n"
}

/// `before`, an entry storing `name(in[i])` to `out[i]`, `after`: 32 threads under every
/// schedule, `out[i] == expected(input[i])`.
fn check_calls(before: &str, after: &str, name: &str, input: &[u32], expected: fn(u32) -> u32) {
    let call = call(name, &["%r10"], Some("%r11"));
    let body = format!("{LOAD_X}{call}st.global.u32 [%rd3], %r11;");
    let expected: Vec<u32> = input.iter().map(|&x| expected(x)).collect();
    let text = format!("{before}{}{after}", entry(&body));
    expect(&text, [1, 32, 1, 1], input, &expected);
}

/// A function returns the sum of its two parameters; one without a result stores through the
/// pointer it receives.
#[test]
fn device_functions_take_parameters_and_return_results() {
    let add2 = ".reg .b32 %r<4>; ld.param.u32 %r1, [add2_param_0]; \
                ld.param.u32 %r2, [add2_param_1]; add.u32 %r3, %r1, %r2; \
                st.param.b32 [func_retval0+0], %r3;";
    let call_add = call("add2", &["%r10", "%r11"], Some("%r12"));
    let load = "ld.global.u32 %r11, [%rd10+128];";
    let body = format!("{LOAD_X}{load}\n{call_add}st.global.u32 [%rd3], %r12;");
    let input = seq(64, |i| [i.wrapping_mul(0x9e37_79b9)]);
    let sum = |i: u32| [input[i as usize].wrapping_add(input[i as usize + 32])];
    let expected = seq(32, sum);
    let text = format!("{}{}", func("add2", 2, add2), entry(&body));
    expect(&text, [1, 32, 1, 1], &input, &expected);

    let store = ".func store_twice(.param .b64 store_twice_param_0, \
                 .param .b32 store_twice_param_1)\n{\n.reg .b32 %r<3>;\n.reg .b64 %rd<2>;\n\
                 ld.param.u64 %rd1, [store_twice_param_0]; \
                 ld.param.u32 %r1, [store_twice_param_1]; shl.b32 %r2, %r1, 1; \
                 st.global.u32 [%rd1], %r2;\nret;\n}\n";
    let body = format!("{LOAD_X}{}", call("store_twice", &["%rd3", "%r10"], None));
    let expected = seq(32, |i| [input[i as usize].wrapping_mul(2)]);
    let text = format!("{store}{}", entry(&body));
    expect(&text, [1, 32, 1, 1], &input[..32], &expected);
}

/// Calls nest three levels deep, by `call` with and without `.uni`: out = (x * x + 3) * 2.
#[test]
fn calls_nest_three_levels_deep() {
    let level = |name: &str, callee: &str, op: &str| {
        let call = call(callee, &["%r1"], Some("%r2")).replace("call.uni", "call");
        let load = format!(".reg .b32 %r<4>; ld.param.u32 %r1, [{name}_param_0];");
        let body = format!("{load}\n{call}{op}\nst.param.b32 [func_retval0+0], %r3;");
        func(name, 1, &body)
    };
    let inner = ".reg .b32 %r<3>; ld.param.u32 %r1, [inner_param_0]; mul.lo.u32 %r2, %r1, %r1; \
                 st.param.b32 [func_retval0+0], %r2;";
    let middle = level("middle", "inner", "add.u32 %r3, %r2, 3;");
    let outer = level("outer", "middle", "shl.b32 %r3, %r2, 1;");
    let functions = format!("{}{middle}{outer}", func("inner", 1, inner));
    let input = seq(32, |i| [i.wrapping_mul(0x0101_0101) + 5]);
    let expected = |x: u32| x.wrapping_mul(x).wrapping_add(3).wrapping_mul(2);
    check_calls(&functions, "", "outer", &input, expected);
}

/// A recursive function sums 1..=n (n = 0..32, 10 included); runaway recursion is an error.
#[test]
fn recursion_works_and_runaway_recursion_is_an_error() {
    let recurse = call("sum", &["%r2"], Some("%r3"));
    let sum = format!(
        ".reg .pred %p<2>;\n.reg .b32 %r<5>;\nld.param.u32 %r1, [sum_param_0]; mov.u32 %r4, 0; \
         setp.eq.u32 %p1, %r1, 0; @%p1 bra $L__sum_done; sub.u32 %r2, %r1, 1;\n{recurse}\
         add.u32 %r4, %r1, %r3;\n$L__sum_done:\nst.param.b32 [func_retval0+0], %r4;"
    );
    let input = seq(32, |n| [n]);
    check_calls(&func("sum", 1, &sum), "", "sum", &input, |n| (1..=n).sum());

    let recurse = call("spin", &["%r2"], Some("%r2"));
    let spin = format!(
        ".reg .b32 %r<3>; ld.param.u32 %r1, [spin_param_0]; add.u32 %r2, %r1, 1;\n{recurse}\
         st.param.b32 [func_retval0+0], %r2;"
    );
    let body = call("spin", &["%r1"], Some("%r10"));
    let text = format!("{}{}", func("spin", 1, &spin), entry(&body));
    let error = run(&text, [1; 4], Schedule::InOrder, &[], 0).unwrap_err();
    let depth = error.to_string().contains("call depth");
    let stopped = depth || matches!(error, EmuError::StepLimit { .. });
    assert!(stopped, "{error}");
}

/// A `.func` defined after its caller is called through a prototype declared before it;
/// calling a function nobody declared does not parse.
#[test]
fn a_function_is_called_through_its_declaration_and_an_undeclared_one_is_refused() {
    let declaration = ".func (.param .b32 func_retval0) triple(.param .b32 triple_param_0);\n";
    let triple = ".reg .b32 %r<3>; ld.param.u32 %r1, [triple_param_0]; mul.lo.u32 %r2, %r1, 3; \
                  st.param.b32 [func_retval0+0], %r2;";
    let (input, triple) = (seq(32, |i| [i * 1000 + 3]), func("triple", 1, triple));
    check_calls(declaration, &triple, "triple", &input, |x| 3 * x);
    let undeclared = entry(&call("nowhere", &["%r1"], Some("%r10")));
    assert!(Module::parse(&format!("{HEADER}{undeclared}")).is_err());
}

/// A callee's `%r1..%r3` and `%p1` are its own: writing them leaves the caller's alone.
#[test]
fn a_callee_does_not_clobber_the_callers_registers() {
    let clobber = ".reg .pred %p<3>;\n.reg .b32 %r<4>;\nld.param.u32 %r1, [clobber_param_0]; \
                   mov.u32 %r2, 999; setp.eq.u32 %p1, %r2, 999; add.u32 %r3, %r1, 1; \
                   st.param.b32 [func_retval0+0], %r3;";
    let call = call("clobber", &["%r10"], Some("%r11"));
    let body = format!(
        "mov.u32 %r3, 333; setp.ne.u32 %p1, %r1, %r1; add.u32 %r10, %r2, 100;\n{call}\
         selp.u32 %r12, 1, 0, %p1; mul.wide.u32 %rd10, %r2, 32; add.u64 %rd10, %rd2, %rd10; \
         st.global.v4.u32 [%rd10], {{%r1, %r2, %r3, %r12}}; st.global.u32 [%rd10+16], %r11;"
    );
    let text = format!("{}{}", func("clobber", 1, clobber), entry(&body));
    let expected = seq(32, |t| [t, t, 333, 0, t + 101, 0, 0, 0]);
    expect(&text, [1, 32, 1, 1], &[], &expected);
}

/// NVRTC-shaped: `poly_call` evaluates a polynomial per thread through a Horner `.func`.
const POLY_CALL: &str = r#"
.func  (.param .b32 func_retval0) _Z6hornerPKfif(
	.param .b64 _Z6hornerPKfif_param_0,
	.param .b32 _Z6hornerPKfif_param_1,
	.param .b32 _Z6hornerPKfif_param_2
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<5>;
	.reg .f32 	%f<6>;
	.reg .b64 	%rd<5>;
	ld.param.u64 	%rd2, [_Z6hornerPKfif_param_0];
	ld.param.u32 	%r3, [_Z6hornerPKfif_param_1];
	ld.param.f32 	%f3, [_Z6hornerPKfif_param_2];
	cvta.to.global.u64 	%rd1, %rd2;
	mov.f32 	%f5, 0f00000000;
	setp.lt.s32 	%p1, %r3, 1;
	@%p1 bra 	$L__BB0_3;
	add.s32 	%r4, %r3, -1;
$L__BB0_2:
	mul.wide.s32 	%rd3, %r4, 4;
	add.s64 	%rd4, %rd1, %rd3;
	ld.global.f32 	%f4, [%rd4];
	fma.rn.f32 	%f5, %f5, %f3, %f4;
	add.s32 	%r4, %r4, -1;
	setp.gt.s32 	%p2, %r4, -1;
	@%p2 bra 	$L__BB0_2;
$L__BB0_3:
	st.param.f32 	[func_retval0+0], %f5;
	ret;
}
	// .globl	poly_call
.visible .entry poly_call(
	.param .u64 poly_call_param_0,
	.param .u64 poly_call_param_1
)
{
	.reg .b32 	%r<3>;
	.reg .f32 	%f<3>;
	.reg .b64 	%rd<8>;
	ld.param.u64 	%rd2, [poly_call_param_0];
	ld.param.u64 	%rd4, [poly_call_param_1];
	cvta.to.global.u64 	%rd3, %rd2;
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd6, %r1, 4;
	add.s64 	%rd7, %rd3, %rd6;
	ld.global.f32 	%f1, [%rd7+32];
	mov.u32 	%r2, 5;
	{ // callseq 0, 0
	.reg .b32 temp_param_reg;
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd2;
	.param .b32 param1;
	st.param.b32 	[param1+0], %r2;
	.param .b32 param2;
	st.param.f32 	[param2+0], %f1;
	.param .b32 retval0;
	call.uni (retval0),
	_Z6hornerPKfif,
	(
	param0,
	param1,
	param2
	);
	ld.param.f32 	%f2, [retval0+0];
	} // callseq 0
	cvta.to.global.u64 	%rd1, %rd4;
	add.s64 	%rd5, %rd1, %rd6;
	st.global.f32 	[%rd5], %f2;
	ret;
}
"#;

/// [`POLY_CALL`] parses and computes Horner's rule (one fma per coefficient), every schedule.
#[test]
fn an_nvrtc_style_call_sequence_parses_and_runs() {
    // `in` holds the 5 coefficients, then (from word 8) each thread's x.
    let coefficients = [0.5f32, -1.25, 2.0, 0.1, 3.0, 0.0, 0.0, 0.0];
    let xs: Vec<f32> = (0..32).map(|i| i as f32 * 0.37 - 3.0).collect();
    let input: Vec<u32> = coefficients.iter().chain(&xs).map(|&v| f(v)).collect();
    let used = &coefficients[..5];
    let horner = |x: f32| used.iter().rfold(0f32, |acc, &c| acc.mul_add(x, c));
    let expected: Vec<u32> = xs.iter().map(|&x| f(horner(x))).collect();
    expect(POLY_CALL, [1, 32, 1, 1], &input, &expected);
}

/// One thread of `body` with `%fd1..%fd3` = `inputs`: the bits of `%fd10`, and `%r10`.
fn f64_run(body: &str, inputs: [f64; 3]) -> (u64, u32) {
    let body = format!(
        ".reg .f64 %fd<16>;\n.reg .f32 %f<8>;\nld.global.f64 %fd1, [%rd1]; \
         ld.global.f64 %fd2, [%rd1+8]; ld.global.f64 %fd3, [%rd1+16];\n{body}\n\
         st.global.f64 [%rd2], %fd10; st.global.u32 [%rd2+8], %r10;"
    );
    let (_, out) = one(&body, &halves(&inputs.map(f64::to_bits)), 3);
    (dword(&out, 0), out[2])
}

const F64_NAN: u64 = 0x7fff_ffff_ffff_ffff;

/// f64 arithmetic, comparisons, `0d` immediates and conversions to and from f32 and s32 give
/// Rust's bits (NaN results canonical); `fma.rn.f64` rounds once, `mul` then `add` twice.
#[test]
fn f64_arithmetic_and_conversions_match_rust_bit_for_bit() {
    let bits = |x: f64| if x.is_nan() { F64_NAN } else { x.to_bits() };
    let (tiny, inf, nan) = (f64::MIN_POSITIVE, f64::INFINITY, f64::NAN);
    let snan = f64::from_bits(0x7ff0_0000_0000_0001);
    let a = [0.1, 1.0, -7.25, 1e308, tiny, 2.5, 0.0, inf, snan, nan];
    let b = [0.2, 3.0, 1e-300, 1e308, 0.5, -0.0, 0.0, 0.0, 1.0, nan];
    for (a, b) in a.into_iter().zip(b) {
        let binary = |op: &str| f64_run(&format!("{op}.f64 %fd10, %fd1, %fd2;"), [a, b, 0.0]).0;
        assert_eq!(binary("add.rn"), bits(a + b), "{a} + {b}");
        assert_eq!(binary("sub.rn"), bits(a - b), "{a} - {b}");
        assert_eq!(binary("mul.rn"), bits(a * b), "{a} * {b}");
        assert_eq!(binary("div.rn"), bits(a / b), "{a} / {b}");
        // A NaN and a number give the number, as in Rust; two NaNs give NaN.
        assert_eq!(binary("min"), bits(a.min(b)), "min({a}, {b})");
        assert_eq!(binary("max"), bits(a.max(b)), "max({a}, {b})");
        let unary = |op: &str| f64_run(&format!("{op}.f64 %fd10, %fd1;"), [a, b, 0.0]).0;
        assert_eq!(unary("sqrt.rn"), bits(a.sqrt()), "sqrt({a})");
        assert!(a.is_nan() || unary("neg") == (-a).to_bits(), "-{a}");
        assert!(a.is_nan() || unary("abs") == a.abs().to_bits(), "|{a}|");
    }
    // a = 1 + 2^-52, c = -(a * a rounded): the fused result is 2^-104, mul then add gives 0.
    let a = 1.0 + f64::EPSILON;
    let c = -(a * a);
    let (fused, unfused) = (a.mul_add(a, c), a * a + c);
    assert_ne!(fused.to_bits(), unfused.to_bits());
    let fma = f64_run("fma.rn.f64 %fd10, %fd1, %fd2, %fd3;", [a, a, c]).0;
    assert_eq!(fma, fused.to_bits());
    let twice = "mul.rn.f64 %fd4, %fd1, %fd2; add.rn.f64 %fd10, %fd4, %fd3;";
    assert_eq!(f64_run(twice, [a, a, c]).0, unfused.to_bits());
    let setp = |cmp: &str, a: f64, b: f64| {
        let body = format!("setp.{cmp}.f64 %p1, %fd1, %fd2; selp.u32 %r10, 1, 0, %p1;");
        f64_run(&body, [a, b, 0.0]).1
    };
    let (x, next) = (1.0, 1.0 + f64::EPSILON);
    assert_eq!(setp("lt", x, next), u32::from(x < next));
    assert_eq!(setp("eq", x, next), u32::from(x == next));
    assert_eq!(setp("eq", -0.0, 0.0), 1);
    assert_eq!([setp("lt", nan, 1.0), setp("gtu", nan, 1.0)], [0, 1]);
    let (mov, _) = f64_run("mov.f64 %fd10, 0d3FF8000000000000;", [0.0; 3]);
    assert_eq!(mov, 1.5f64.to_bits());
    let widen = "mov.f32 %f1, 0f3DCCCCCD; cvt.f64.f32 %fd10, %f1;";
    let widened = f64::from(f32::from_bits(0x3dcc_cccd));
    assert_eq!(f64_run(widen, [0.0; 3]).0, widened.to_bits());
    let narrow = "cvt.rn.f32.f64 %f2, %fd1; mov.b32 %r10, %f2;";
    let halfway = 1.0 + 2f64.powi(-24);
    for x in [0.1, halfway, halfway + 2f64.powi(-52), -1e300] {
        assert_eq!(f64_run(narrow, [x, 0.0, 0.0]).1, f(x as f32), "{x}");
    }
    for v in [i32::MIN, -7, i32::MAX] {
        let body = format!("mov.b32 %r11, {}; cvt.rn.f64.s32 %fd10, %r11;", v as u32);
        assert_eq!(f64_run(&body, [0.0; 3]).0, f64::from(v).to_bits(), "{v}");
    }
    let truncate = |x: f64| f64_run("cvt.rzi.s32.f64 %r10, %fd1;", [x, 0.0, 0.0]).1 as i32;
    let inputs = [-2.7, 2_147_483_646.9, 1e10, -1e10, nan];
    let expected = [-2, 2_147_483_646, i32::MAX, i32::MIN, 0];
    assert_eq!(inputs.map(truncate), expected);
}

/// `.ftz` replaces subnormal f32 inputs and results by zeros of the same sign; every case
/// has different answers with and without it.
#[test]
fn ftz_flushes_subnormal_inputs_and_results_to_signed_zeros() {
    let flush = |x: f32| if x.is_subnormal() { x * 0.0 } else { x }; // Keeps the sign.
    let bits = |x: f32| if x.is_nan() { 0x7fff_ffff } else { x.to_bits() };
    let run = |body: &str, inputs: &[u32]| {
        let load = "ld.global.b32 %r11, [%rd1]; ld.global.b32 %r12, [%rd1+4]; \
                    ld.global.b32 %r13, [%rd1+8];";
        let body = format!("{load}\n{body}\nst.global.b32 [%rd2], %r10;");
        one(&body, inputs, 1).1[0]
    };
    let (tiny, sign) = (f(2f32.powi(-70)), 0x8000_0000);
    type Op = fn(f32, f32, f32) -> f32;
    let cases: [(&str, [u32; 3], Op); 14] = [
        ("mul", [1, f(2.0), 0], |a, b, _| a * b),
        ("mul.rn", [tiny, tiny ^ sign, 0], |a, b, _| a * b),
        ("add.rn", [sign | 1, 0, 0], |a, b, _| a + b),
        ("add", [sign | 1, sign, 0], |a, b, _| a + b),
        ("sub.rn", [0x0080_0000, 1, 0], |a, b, _| a - b),
        ("sub", [0x0080_0001, 0x0080_0000, 0], |a, b, _| a - b),
        ("div.rn", [0x0040_0000, f(0.5), 0], |a, b, _| a / b),
        ("div.rn", [0x0080_0000, f(2.0), 0], |a, b, _| a / b),
        ("min", [5, f(1.0), 0], |a, b, _| a.min(b)),
        ("max", [sign | 5, f(-1.0), 0], |a, b, _| a.max(b)),
        ("fma.rn", [1, f(2f32.powi(100)), 0], f32::mul_add),
        ("fma.rn", [tiny, tiny, sign], f32::mul_add),
        ("sqrt.rn", [1, 0, 0], |a, _, _| a.sqrt()),
        ("sqrt.rn", [sign | 1, 0, 0], |a, _, _| a.sqrt()),
    ];
    for (op, inputs, rust) in cases {
        let [a, b, c] = inputs.map(f32::from_bits);
        let ftz = bits(flush(rust(flush(a), flush(b), flush(c))));
        let plain = bits(rust(a, b, c));
        assert_ne!(ftz, plain, "{op} {inputs:x?} does not tell .ftz apart");
        let arity = usize::from(op != "sqrt.rn") + usize::from(op == "fma.rn");
        let operands = ["%r11", "%r11, %r12", "%r11, %r12, %r13"][arity];
        let with = run(&format!("{op}.ftz.f32 %r10, {operands};"), &inputs);
        assert_eq!(with, ftz, "{op}.ftz.f32 {inputs:x?}");
        let without = run(&format!("{op}.f32 %r10, {operands};"), &inputs);
        assert_eq!(without, plain, "{op}.f32 {inputs:x?}");
    }
    // setp: a subnormal equals 0.0; a negative one is neither below nor unequal to 0.0.
    let cmps = [("eq", 1), ("lt", sign | 1), ("ne", 0x807f_ffff)];
    for (i, (cmp, a)) in cmps.into_iter().enumerate() {
        let rust = |x: f32| [x == 0.0, x < 0.0, x != 0.0][i];
        let x = f32::from_bits(a);
        assert_ne!(rust(flush(x)), rust(x));
        for (ftz, expected) in [(".ftz", rust(flush(x))), ("", rust(x))] {
            let body = format!("setp.{cmp}{ftz}.f32 %p1, %r11, %r12; selp.u32 %r10, 1, 0, %p1;");
            assert_eq!(run(&body, &[a, 0, 0]), u32::from(expected), "{body}");
        }
    }
}

/// The source lane and predicate of `shfl.sync.{mode}` in `lane`, by the ISA's formula.
fn shfl_source(mode: &str, lane: u32, b: u32, c: u32) -> (u32, bool) {
    let (lane, up) = (lane as i32, mode == "up");
    let (bval, clamp, seg) = ((b & 31) as i32, (c & 31) as i32, ((c >> 8) & 31) as i32);
    let (max_lane, min_lane) = ((lane & seg) | (clamp & !seg), lane & seg);
    let j = match mode {
        "up" => lane - bval,
        "down" => lane + bval,
        "bfly" => lane ^ bval,
        _ => min_lane | (bval & !seg),
    };
    let p = if up { j >= max_lane } else { j <= max_lane };
    (if p { j as u32 } else { lane as u32 }, p)
}

/// Each shuffle mode in the two warps of a 16x4 block reads `a` of the lane the ISA's formula
/// picks (its own with p false); a five-step butterfly gives each lane its warp's sum.
#[test]
fn shuffles_read_the_lane_the_isa_formula_picks() {
    let cases = "down 1 0x1f, down 5 0x1f, down 16 0x1f, up 1 0, up 4 0, bfly 1 0x1f, \
                 bfly 16 0x1f, idx 7 0x1f, idx 39 0x1f, down 2 0x181f, up 3 0x1800, \
                 bfly 4 0x181f, idx 3 0x181f";
    for case in cases.split(", ") {
        let fields: Vec<&str> = case.split(' ').collect();
        let (mode, b, c) = (fields[0], num(fields[1]) as u32, num(fields[2]) as u32);
        let body = format!(
            "mov.u32 %r10, %tid.y; mad.lo.u32 %r12, %r10, %r3, %r1; mad.lo.u32 %r13, %r12, 3, 1; \
             mov.u32 %r14, {b}; mov.u32 %r15, {c}; mov.u32 %r16, 0xffffffff; \
             shfl.sync.{mode}.b32 %r17|%p1, %r13, %r14, %r15, %r16; selp.u32 %r18, 1, 0, %p1; \
             shfl.sync.{mode}.b32 %r19, %r13, {b}, {c}, 0xffffffff; \
             mul.wide.u32 %rd10, %r12, 12; add.u64 %rd10, %rd2, %rd10; \
             st.global.u32 [%rd10], %r17; st.global.u32 [%rd10+4], %r18; \
             st.global.u32 [%rd10+8], %r19;"
        );
        let lane = |linear: u32| {
            let (source, p) = shfl_source(mode, linear % 32, b, c);
            let value = 3 * (linear / 32 * 32 + source) + 1;
            [value, u32::from(p), value]
        };
        let expected: Vec<u32> = (0..64).flat_map(lane).collect();
        for s in Schedule::ALL {
            let (_, out) = ok(&entry(&body), [1, 16, 4, 1], s, &[], 192);
            assert_eq!(out, expected, "shfl.sync.{case} {s:?}");
        }
    }
    let step =
        |s: u32| format!("shfl.sync.bfly.b32 %r11, %r10, {s}, 31, -1; add.u32 %r10, %r10, %r11;\n");
    let steps: String = [16, 8, 4, 2, 1].map(step).concat();
    let text = entry(&format!("{LOAD_X}{steps}st.global.u32 [%rd3], %r10;"));
    let input = seq(64, |t| [t.wrapping_mul(t) ^ 0x5a5a_1234]);
    let sum = |warp: &[u32]| warp.iter().fold(0u32, |s, &v| s.wrapping_add(v));
    let expected: Vec<u32> = input.chunks(32).flat_map(|warp| [sum(warp); 32]).collect();
    expect(&text, [1, 64, 1, 1], &input, &expected);
}

/// A partial warp shuffles within membermask 0xffff; a membermask naming absent lanes, or a
/// lane that exited early, is an error.
#[test]
fn shuffles_need_every_lane_of_their_membermask() {
    use EmuError::{Deadlock, Undefined};
    let kernel = |mask: &str, exit: &str| {
        entry(&format!(
            "setp.lt.u32 %p1, %r1, 32; selp.b32 %r10, 0xffffffff, {mask}, %p1; {exit}\n\
             mad.lo.u32 %r11, %r1, 3, 1; shfl.sync.bfly.b32 %r12, %r11, 8, 0x1f, %r10; \
             shfl.sync.idx.b32 %r13, %r11, 3, 0x1f, %r10; mul.wide.u32 %rd10, %r1, 8; \
             add.u64 %rd10, %rd2, %rd10; st.global.v2.u32 [%rd10], {{%r12, %r13}};"
        ))
    };
    let a = |t: u32| 3 * t + 1;
    let lane = |t: u32| [a(t / 32 * 32 + ((t % 32) ^ 8)), a(t / 32 * 32 + 3)];
    let expected: Vec<u32> = (0..48).flat_map(lane).collect();
    expect(&kernel("0x0000ffff", ""), [1, 48, 1, 1], &[], &expected);
    let exited = "setp.eq.u32 %p2, %r1, 5; @%p2 ret;";
    for (exit, threads) in [("", 48), (exited, 32)] {
        for s in Schedule::ALL {
            let text = kernel("0xffffffff", exit);
            let error = run(&text, [1, threads, 1, 1], s, &[], 96).unwrap_err();
            let fault = matches!(error, Undefined { .. } | Deadlock { .. });
            assert!(fault, "{exit} {s:?}: {error}");
        }
    }
}

/// `and/or/xor/not/mov.pred` over the whole truth table (thread t: a = t & 1, b = t >> 1).
#[test]
fn predicate_logic_follows_its_truth_table() {
    let body = "and.b32 %r10, %r1, 1; shr.u32 %r11, %r1, 1; setp.ne.u32 %p1, %r10, 0; \
                setp.ne.u32 %p2, %r11, 0; and.pred %p3, %p1, %p2; or.pred %p4, %p1, %p2; \
                xor.pred %p5, %p1, %p2; not.pred %p6, %p1; mov.pred %p7, %p2; \
                selp.u32 %r12, 1, 0, %p3; selp.u32 %r13, 1, 0, %p4; selp.u32 %r14, 1, 0, %p5; \
                selp.u32 %r15, 1, 0, %p6; selp.u32 %r16, 1, 0, %p7; mul.wide.u32 %rd10, %r1, 32; \
                add.u64 %rd10, %rd2, %rd10; st.global.u32 [%rd10+16], %r16; \
                st.global.v4.u32 [%rd10], {%r12, %r13, %r14, %r15};";
    let row = |t: u32| {
        let (a, b) = (t & 1 == 1, t >> 1 == 1);
        [a && b, a || b, a ^ b, !a, b, false, false, false].map(u32::from)
    };
    expect(&entry(body), [1, 4, 1, 1], &[], &seq(4, row));
}
