//! `bench-gate`: fails when a tracked Criterion median regressed past its
//! limit in `bench-results/baseline.json`, printing every tracked metric.
//!
//! Usage: `bench-gate [--baseline FILE] (--criterion-dir DIR | --summary FILE)`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tensor_wasm_bench::gate::{
    evaluate, medians_from_criterion_dir, medians_from_summary, Baseline,
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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = (|| -> anyhow::Result<bool> {
        let baseline = Baseline::load(&args.baseline)?;
        let run = match (&args.criterion_dir, &args.summary) {
            (Some(dir), None) => medians_from_criterion_dir(dir)?,
            (None, Some(file)) => medians_from_summary(file)?,
            _ => anyhow::bail!("give --criterion-dir or --summary"),
        };
        let report = evaluate(&baseline, &run);
        print!("{}", report.table());
        Ok(report.passed())
    })();
    match result {
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
