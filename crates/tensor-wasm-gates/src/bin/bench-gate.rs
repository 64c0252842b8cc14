//! `bench-gate`: fails when a tracked Criterion median regressed past its
//! limit in `bench-results/baseline.json`, printing every tracked metric.
//!
//! Usage: `bench-gate [--baseline FILE] (--criterion-dir DIR [--rerun -- COMMAND...] | --summary FILE)`
//!
//! With `--rerun`, regressed metrics (when none is missing) are measured once
//! more before the gate decides: COMMAND (the bench command of the first run)
//! is run with one more argument, a Criterion filter matching exactly the
//! regressed ids, and with `CRITERION_HOME` set to DIR; only metrics that
//! regress again fail.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context as _};
use clap::Parser;
use tensor_wasm_gates::criterion_filter::exact_ids;
use tensor_wasm_gates::gate::{
    evaluate, gate_criterion_dir, medians_from_summary, Baseline, Rerun,
};

/// Compares a run with the committed baseline.
#[derive(Debug, Parser)]
struct Args {
    /// The baseline file.
    #[arg(long, default_value = "bench-results/baseline.json")]
    baseline: PathBuf,
    /// Criterion's output directory of the run.
    #[arg(long, conflicts_with = "summary")]
    criterion_dir: Option<PathBuf>,
    /// A run file written by scripts/criterion_summary.py.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Re-run regressed metrics once with the bench command given after `--`
    /// (needs --criterion-dir); fail only for those that regress again.
    #[arg(long, requires = "criterion_dir")]
    rerun: bool,
    /// The bench command of the run, for --rerun.
    #[arg(last = true)]
    command: Vec<String>,
}

/// Runs `command` with the filter for `ids` appended and `CRITERION_HOME=dir`,
/// inheriting stdout and stderr.
fn rerun(command: &[String], dir: &Path, ids: &[&str]) -> anyhow::Result<()> {
    let Some((program, args)) = command.split_first() else {
        bail!("--rerun needs the bench command after `--`");
    };
    let filter = exact_ids(ids);
    let shown: Vec<String> = command
        .iter()
        .chain([&filter])
        .map(|arg| shell_quoted(arg))
        .collect();
    println!(
        "bench-gate: CRITERION_HOME={} {}",
        shell_quoted(&dir.display().to_string()),
        shown.join(" ")
    );
    let status = Command::new(program)
        .args(args)
        .arg(&filter)
        .env("CRITERION_HOME", dir)
        .status()
        .with_context(|| format!("starting {program}"))?;
    if !status.success() {
        bail!("{program} exited with {status}");
    }
    Ok(())
}

/// `arg` as a POSIX shell would need it to be written (for the log line only).
fn shell_quoted(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn run(args: &Args) -> anyhow::Result<bool> {
    let baseline = Baseline::load(&args.baseline)?;
    if args.rerun == args.command.is_empty() {
        bail!("--rerun and a bench command after `--` go together");
    }
    match (&args.criterion_dir, &args.summary) {
        (Some(dir), None) => {
            // Bench binaries run in their package's directory: the re-run gets
            // an absolute CRITERION_HOME.
            let home =
                std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
            let mut confirm = |ids: &[&str]| rerun(&args.command, &home, ids);
            let confirm: Option<&mut Rerun<'_>> =
                if args.rerun { Some(&mut confirm) } else { None };
            gate_criterion_dir(&baseline, dir, confirm, &mut std::io::stdout())
        }
        (None, Some(file)) => {
            let report = evaluate(&baseline, &medians_from_summary(file)?);
            print!("{}", report.table());
            Ok(report.passed())
        }
        _ => bail!("give --criterion-dir or --summary"),
    }
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(true) => {
            println!("bench-gate: pass");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("bench-gate: FAIL");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench-gate: {e:#}");
            ExitCode::from(2)
        }
    }
}
