//! Out-of-bounds mutants of the corpus: each changes one address, one launch or adds one
//! forbidden instruction to NVRTC's PTX of a CUDA C++ kernel of the conformance set. A
//! mutant counts when the tenant's own (unfenced) module escapes: it faults at an address
//! outside the launch's memory, or the verifier refuses it. Every mutant the verifier accepts
//! must then be contained: its fenced module never reaches an address outside the window.
//!
//! The launch is given the guest memory (the window) and the cancel word only; the foreign
//! memory on both sides of the window is another tenant's, not given to the launch, so the
//! interpreter reports any read or write of it — or of anything else — as an illegal
//! address. Skipped, saying so, where NVRTC is not installed.

mod common;

use std::collections::BTreeMap;

use tensor_wasm_gpu::{compile_cuda, nvrtc_available, KernelArg};
use tensor_wasm_jit::conformance::{cuda_cases, CudaCase};
use tensor_wasm_ptx_emu::{EmuError, Module, Schedule, LOCAL_WINDOW, SHARED_WINDOW};
use tensor_wasm_ptx_verify::Plan;

use common::{pack, run_with, Mode, BASE, FOREIGN};

/// One mutant: its category, the PTX, and the launch's packed arguments and grid.
struct Mutant {
    category: &'static str,
    ptx: String,
    args: Vec<Vec<u8>>,
    grid_scale: u32,
}

/// The base register and whether the access is an atomic and generic, of a memory line.
fn access(line: &str) -> Option<(String, bool, bool)> {
    let opcode = line.split_whitespace().find(|w| !w.starts_with('@'))?;
    let base = opcode.split('.').next()?;
    if !matches!(base, "ld" | "st" | "atom" | "red") || opcode.contains(".param") {
        return None;
    }
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    let inner = &line[open + 1..close];
    let register = inner.split(['+', '-']).next()?.trim();
    if !register.starts_with("%rd") {
        return None;
    }
    let generic =
        !opcode.contains(".global") && !opcode.contains(".shared") && !opcode.contains(".local");
    Some((register.to_owned(), matches!(base, "atom" | "red"), generic))
}

/// Every mutant of one case.
fn mutants(ptx: &str, case: &CudaCase) -> Vec<Mutant> {
    let window = case.layout.memory.len() as i64;
    let lines: Vec<&str> = ptx.lines().collect();
    let args = pack(&case.args);
    let mut out = Vec::new();
    let with = |at: usize, inserted: String| -> String {
        let mut text: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
        text.insert(at, inserted);
        text.join("\n")
    };
    let accesses: Vec<(usize, String, bool, bool)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| access(l).map(|(r, atomic, generic)| (i, r, atomic, generic)))
        .collect();
    for (at, reg, atomic, generic) in accesses.iter().take(4) {
        let mut push = |category: &'static str, instruction: String| {
            out.push(Mutant {
                category: if *atomic {
                    "atomic on a foreign address"
                } else {
                    category
                },
                ptx: with(*at, format!("\t{instruction}")),
                args: args.clone(),
                grid_scale: 1,
            });
        };
        for wild in [
            (BASE as i64 - 8) as u64,
            (BASE as i64 + window + 64) as u64,
            0xdead_beef_0000,
        ] {
            push("wild address", format!("mov.u64 {reg}, {wild};"));
        }
        for delta in [window, window + 4096, 1 << 20] {
            push(
                "computed past the end",
                format!("add.s64 {reg}, {reg}, {delta};"),
            );
        }
        for delta in [-8i64, -4096, -(1 << 30)] {
            push("negative offset", format!("add.s64 {reg}, {reg}, {delta};"));
        }
        for delta in [1i64 << 32, -(1i64 << 32)] {
            push(
                "32-bit wrap-around",
                format!("add.s64 {reg}, {reg}, {delta};"),
            );
        }
        push("misaligned", format!("add.s64 {reg}, {reg}, 1;"));
        let into_spaces = [
            SHARED_WINDOW + (1 << 20),
            LOCAL_WINDOW + 64,
            SHARED_WINDOW - 64,
        ];
        for address in into_spaces {
            push(
                if *generic {
                    "generic pointer into another space"
                } else {
                    "pointer into another space"
                },
                format!("mov.u64 {reg}, {address};"),
            );
        }
    }
    // Launch mutants: buffer parameters outside the window (the cancel word's address
    // among them), and sizes and grids eight times too large.
    let buffers: Vec<usize> = case
        .args
        .iter()
        .enumerate()
        .filter(|(_, a)| matches!(a, KernelArg::Buffer { .. }))
        .map(|(i, _)| i)
        .collect();
    for &index in &buffers {
        for address in [
            (BASE as i64 + window + 256) as u64,
            BASE - 4096,
            BASE + window as u64 + FOREIGN as u64,
        ] {
            let mut mutated = args.clone();
            mutated[index] = address.to_le_bytes().to_vec();
            out.push(Mutant {
                category: "parameter outside the window",
                ptx: ptx.to_owned(),
                args: mutated,
                grid_scale: 1,
            });
        }
    }
    for (index, arg) in case.args.iter().enumerate() {
        let scaled = match *arg {
            KernelArg::U32(n) => n.checked_mul(8).map(|v| v.to_le_bytes().to_vec()),
            KernelArg::I32(n) => n.checked_mul(8).map(|v| v.to_le_bytes().to_vec()),
            KernelArg::U64(n) => n.checked_mul(8).map(|v| v.to_le_bytes().to_vec()),
            _ => None,
        };
        if let Some(bytes) = scaled {
            let mut mutated = args.clone();
            mutated[index] = bytes;
            out.push(Mutant {
                category: "oversized grid and sizes",
                ptx: ptx.to_owned(),
                args: mutated,
                grid_scale: 8,
            });
        }
    }
    // Forbidden control flow, each before the first instruction after the parameter loads.
    let first = lines
        .iter()
        .position(|l| l.trim_start().starts_with("mov.u32") || l.trim_start().starts_with("cvta"))
        .unwrap_or(lines.len() / 2);
    for (category, instruction) in [
        ("indirect branch", "brx.idx %r1, $tw_targets;"),
        ("indirect call", "call.uni (%r1), %rd1, (%r1);"),
        ("local address made generic", "cvta.local.u64 %rd1, %rd1;"),
        (
            "texture",
            "tex.1d.v4.f32.s32 {%f1, %f1, %f1, %f1}, [%rd1, {%r1}];",
        ),
        ("constant memory", "ld.const.u32 %r1, [%rd1];"),
    ] {
        out.push(Mutant {
            category,
            ptx: with(first, format!("\t{instruction}")),
            args: args.clone(),
            grid_scale: 1,
        });
    }
    out
}

/// Whether an error is an access outside the launch's memory.
fn escaped(error: &EmuError) -> bool {
    matches!(
        error,
        EmuError::IllegalAddress { .. } | EmuError::Misaligned { .. }
    )
}

#[derive(Default)]
struct Tally {
    mutants: u32,
    refused: u32,
    contained: u32,
    stayed_inside: u32,
}

#[test]
fn out_of_bounds_mutants_are_refused_or_contained() {
    if let Err(reason) = nvrtc_available() {
        println!("skipped: {reason}");
        return;
    }
    let mut tally: BTreeMap<&'static str, Tally> = BTreeMap::new();
    for case in cuda_cases() {
        let entry = case.kernel.entry;
        let ptx = compile_cuda(case.kernel.source, entry, (8, 0)).unwrap().ptx;
        for mutant in mutants(&ptx, &case) {
            let mut scaled = case.clone();
            scaled.config.grid[0] *= mutant.grid_scale;
            let row = tally.entry(mutant.category).or_default();
            let memory = &case.layout.memory;
            let schedule = Schedule::InOrder;
            let plain = match Module::parse(&mutant.ptx) {
                Ok(module) => run_with(
                    &module,
                    None,
                    &scaled,
                    &mutant.args,
                    memory,
                    Mode::Plain,
                    schedule,
                )
                .err(),
                Err(_) => None,
            };
            match tensor_wasm_ptx_verify::fence(&mutant.ptx) {
                Err(refusal) => {
                    assert!(
                        refusal.line > 0,
                        "{entry}: a refusal names its line: {refusal}"
                    );
                    assert!(
                        !refusal.reason.starts_with("malformed"),
                        "{entry} ({}): refused for a rule, not as malformed: {refusal}",
                        mutant.category
                    );
                    row.mutants += 1;
                    row.refused += 1;
                }
                Ok(fenced) => {
                    if !plain.as_ref().is_some_and(escaped) {
                        row.stayed_inside += 1;
                        continue;
                    }
                    row.mutants += 1;
                    let module = Module::parse(&fenced.ptx).unwrap();
                    let plan = Plan::new(&fenced.ptx, entry).expect("a plan for every entry");
                    // Fenced, and as a backend runs it: the launch-time proof must never
                    // admit the lean entry of a mutant that escapes.
                    for mode in [Mode::Fenced, Mode::Checked] {
                        let outcome = run_with(
                            &module,
                            Some(&plan),
                            &scaled,
                            &mutant.args,
                            memory,
                            mode,
                            schedule,
                        );
                        match &outcome {
                            Err(error) => assert!(
                                !escaped(error),
                                "{entry} ({}, {mode:?}): the mutant escaped: {error}\n{}",
                                mutant.category,
                                fenced.ptx
                            ),
                            Ok(outcome) => assert!(
                                !outcome.lean,
                                "{entry} ({}): the proof admitted an escaping mutant\n{}",
                                mutant.category, mutant.ptx
                            ),
                        }
                    }
                    row.contained += 1;
                }
            }
        }
    }
    let mut total = Tally::default();
    println!(
        "category: out-of-bounds mutants, refused, accepted and contained (stayed inside unfenced)"
    );
    for (category, row) in &tally {
        println!(
            "  {category}: {}, {}, {} ({})",
            row.mutants, row.refused, row.contained, row.stayed_inside
        );
        total.mutants += row.mutants;
        total.refused += row.refused;
        total.contained += row.contained;
    }
    println!(
        "total: {} mutants, {} refused, {} accepted and contained",
        total.mutants, total.refused, total.contained
    );
    assert!(total.mutants >= 500, "{} mutants", total.mutants);
    assert_eq!(total.refused + total.contained, total.mutants);
    assert!(
        2 * total.contained >= total.mutants,
        "at least half accepted and contained"
    );
}
