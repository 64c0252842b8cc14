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
use std::process::{Command, ExitCode};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use serde::Serialize;
use tensor_wasm_bench::icount::{
    counts_from_file, evaluate, IcountBaseline, IcountPolicy, IcountTracked,
};

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

#[derive(Debug, Serialize)]
struct Machine {
    cpu: String,
    cores: usize,
    kernel: String,
    arch: &'static str,
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

fn tool_version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `HEAD`, with `-dirty` when `crates/` differs from it (as scripts/criterion_summary.py).
fn commit() -> String {
    let Some(head) = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
    else {
        return "unknown".to_owned();
    };
    let dirty = Command::new("git")
        .args(["diff", "--quiet", "HEAD", "--", "crates"])
        .status()
        .is_ok_and(|s| !s.success());
    format!("{}{}", head.trim(), if dirty { "-dirty" } else { "" })
}

fn machine() -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned());
    let kernel = match (
        read("/proc/sys/kernel/ostype"),
        read("/proc/sys/kernel/osrelease"),
    ) {
        (Ok(os), Ok(release)) => format!("{os} {release}"),
        _ => "unknown".to_owned(),
    };
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        kernel,
        arch: std::env::consts::ARCH,
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_413), (2025, 11, 21));
    }
}
