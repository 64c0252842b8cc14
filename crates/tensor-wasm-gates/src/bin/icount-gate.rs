//! `icount-gate`: the instruction-count gate over a gungraun run of the
//! hot-path benches (`crates/tensor-wasm-icount`).
//!
//! - `icount-gate check --run RUN.jsonl [--baseline FILE]` prints every
//!   tracked hot path (baseline, now, delta, limit, verdict) and fails when one
//!   executes more than `max_increase_pct` (10 %) more instructions than
//!   recorded, or is missing from the run.
//! - `icount-gate record --run RUN.jsonl --out FILE --command CMD` writes a new
//!   baseline from the run, with machine, tools, date, commit and command
//!   (`make icount-baseline`).
//!
//! `RUN.jsonl` is what `cargo bench -p tensor-wasm-icount --bench icount --
//! --output-format=json` prints on stdout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use serde::Serialize;
use tensor_wasm_gates::icount::{
    counts_from_file, evaluate, IcountBaseline, IcountPolicy, IcountTracked,
};
use tensor_wasm_gates::runinfo::{commit, machine, tool_version, utc_now, Machine};

/// The instruction-count gate.
#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Compares a run with the committed baseline; exit 1 on a regression.
    Check {
        /// gungraun's JSON lines of the run.
        #[arg(long)]
        run: PathBuf,
        /// The baseline file.
        #[arg(long, default_value = "bench-results/icount/baseline.json")]
        baseline: PathBuf,
    },
    /// Writes a baseline from a run.
    Record {
        /// gungraun's JSON lines of the run.
        #[arg(long)]
        run: PathBuf,
        /// Where to write the baseline (its policy is kept if it exists).
        #[arg(long, default_value = "bench-results/icount/baseline.json")]
        out: PathBuf,
        /// The command that produced the run, recorded as is.
        #[arg(long)]
        command: String,
    },
}

/// The recorded baseline, fields in the order they are written.
#[derive(Debug, Serialize)]
struct BaselineFile {
    description: &'static str,
    date: String,
    commit: String,
    command: String,
    machine: Machine,
    tools: BTreeMap<&'static str, String>,
    policy: IcountPolicy,
    metrics: BTreeMap<String, IcountTracked>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Cmd::Check { run, baseline } => check(&run, &baseline),
        Cmd::Record { run, out, command } => record(&run, &out, command).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("icount-gate: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn check(run: &Path, baseline: &Path) -> anyhow::Result<bool> {
    let baseline = IcountBaseline::load(baseline)?;
    let counts = counts_from_file(run)?;
    let report = evaluate(&baseline, &counts);
    print!("{}", report.table());
    if report.passed() {
        println!(
            "icount-gate: pass (limit +{}% instructions per hot path)",
            baseline.policy.max_increase_pct
        );
    } else {
        println!(
            "icount-gate: FAIL (limit +{}% instructions per hot path)",
            baseline.policy.max_increase_pct
        );
    }
    Ok(report.passed())
}

fn record(run: &Path, out: &Path, command: String) -> anyhow::Result<()> {
    let counts = counts_from_file(run)?;
    let policy = match IcountBaseline::load(out) {
        Ok(previous) => previous.policy,
        Err(_) if !out.exists() => IcountPolicy {
            max_increase_pct: 10.0,
        },
        Err(e) => return Err(e.context("the existing baseline (its policy is kept)")),
    };
    let mut tools = BTreeMap::new();
    tools.insert("valgrind", tool_version("valgrind", &["--version"]));
    tools.insert("rustc", tool_version("rustc", &["--version"]));
    if let Some(runner) = std::env::var_os("GUNGRAUN_RUNNER") {
        tools.insert(
            "gungraun-runner",
            tool_version(&runner.to_string_lossy(), &["--version"]),
        );
    }
    let file = BaselineFile {
        description: "Instruction counts (callgrind Ir, one call) of the hot paths, gated at +max_increase_pct; see baseline-notes.md",
        date: utc_now(),
        commit: commit(),
        command,
        machine: machine(),
        tools,
        policy,
        metrics: counts
            .into_iter()
            .map(|(id, instructions)| (id, IcountTracked { instructions }))
            .collect(),
    };
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(&file)?;
    text.push('\n');
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    println!(
        "icount-gate: recorded {} hot paths in {}",
        file.metrics.len(),
        out.display()
    );
    Ok(())
}
