//! The instruction-count gate: compares the callgrind instruction counts (`Ir`)
//! of a gungraun run of the hot-path benches (`crates/tensor-wasm-icount`)
//! with `bench-results/icount/baseline.json`.
//!
//! Instruction counts do not drift with machine load, so the threshold is
//! tight: a tracked path fails when it executes more than
//! `instructions × (1 + max_increase_pct / 100)` (10 % in the committed
//! policy). A tracked path missing from the run fails too; a path measured
//! but not tracked is listed, to be recorded with `make icount-baseline` in a
//! commit of its own. A path that got cheaper by more than the threshold
//! passes with a note, so that the baseline is re-recorded and keeps the gain.
//!
//! Input: the JSON lines gungraun prints with `--output-format=json` (one
//! benchmark summary per line, schema version 7); a benchmark's id is
//! `<function>/<bench id>`, e.g. `tenant_lookup/lookup_256`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gate::Verdict;

/// The regression policy of the instruction-count gate.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
pub struct IcountPolicy {
    /// A tracked path fails above `instructions × (1 + max_increase_pct / 100)`.
    pub max_increase_pct: f64,
}

/// One tracked hot path.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct IcountTracked {
    /// Instructions executed by one call (callgrind `Ir`), as recorded.
    pub instructions: u64,
}

/// `bench-results/icount/baseline.json` (the other fields — machine, tools,
/// date, commit, command — are for people and for PERFORMANCE.md).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct IcountBaseline {
    pub policy: IcountPolicy,
    pub metrics: BTreeMap<String, IcountTracked>,
}

impl IcountBaseline {
    /// Reads and checks a baseline file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let baseline: IcountBaseline =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let pct = baseline.policy.max_increase_pct;
        if pct.is_nan() || pct < 0.0 {
            bail!("policy.max_increase_pct must be >= 0");
        }
        for (id, m) in &baseline.metrics {
            if m.instructions == 0 {
                bail!("baseline metric {id}: instructions must be > 0");
            }
        }
        Ok(baseline)
    }
}

/// Instruction counts by benchmark id from gungraun's `--output-format=json`
/// lines. Lines that are not JSON objects (there should be none) are an error,
/// as is a benchmark without a Callgrind `Ir` total or an id seen twice.
pub fn counts_from_gungraun_json(text: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let summary: Value = serde_json::from_str(line)
            .with_context(|| format!("line {}: not a gungraun JSON summary", n + 1))?;
        let function = summary["function_name"]
            .as_str()
            .with_context(|| format!("line {}: no function_name", n + 1))?;
        let id = match summary["id"].as_str() {
            Some(bench) => format!("{function}/{bench}"),
            None => function.to_owned(),
        };
        let profiles = summary["profiles"]
            .as_array()
            .with_context(|| format!("{id}: no profiles"))?;
        let callgrind = profiles
            .iter()
            .find(|p| p["tool"] == "Callgrind")
            .with_context(|| format!("{id}: no Callgrind profile"))?;
        let ir = callgrind["data"]["total"]["metrics"]["Ir"]["values"]["new"]
            .as_u64()
            .with_context(|| format!("{id}: no Callgrind Ir total"))?;
        if out.insert(id.clone(), ir).is_some() {
            bail!("{id}: measured twice in one run");
        }
    }
    if out.is_empty() {
        bail!("no benchmark in the run (was gungraun run with --output-format=json?)");
    }
    Ok(out)
}

/// [`counts_from_gungraun_json`] of a file.
pub fn counts_from_file(path: &Path) -> anyhow::Result<BTreeMap<String, u64>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    counts_from_gungraun_json(&text).with_context(|| format!("in {}", path.display()))
}

/// One row of the gate's table.
#[derive(Debug, Clone, PartialEq)]
pub struct IcountRow {
    pub id: String,
    pub baseline: u64,
    pub now: Option<u64>,
    /// `baseline × (1 + max_increase_pct / 100)`; a count above it fails.
    pub limit: f64,
    pub verdict: Verdict,
    /// Cheaper than `baseline × (1 - max_increase_pct / 100)`: passes, but
    /// the baseline should be re-recorded to keep the gain.
    pub improved: bool,
}

/// The gate's decision over a run.
#[derive(Debug, Clone, PartialEq)]
pub struct IcountReport {
    pub rows: Vec<IcountRow>,
    /// Measured but not in the baseline.
    pub untracked: Vec<(String, u64)>,
}

impl IcountReport {
    /// Whether every tracked path was measured and within its limit.
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.verdict == Verdict::Ok)
    }

    /// The table printed by `icount-gate check`.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<40} {:>12} {:>12} {:>9} {:>12}  verdict",
            "hot path (instructions)", "baseline", "now", "delta", "max allowed"
        );
        for r in &self.rows {
            let (now, delta) = match r.now {
                Some(now) => (
                    now.to_string(),
                    format!("{:+.2}%", (now as f64 / r.baseline as f64 - 1.0) * 100.0),
                ),
                None => ("-".into(), "-".into()),
            };
            let verdict = match (r.verdict, r.improved) {
                (Verdict::Ok, false) => "ok",
                (Verdict::Ok, true) => "ok, cheaper (re-record: make icount-baseline)",
                (Verdict::Regressed, _) => "REGRESSED",
                (Verdict::Missing, _) => "MISSING from the run",
            };
            let _ = writeln!(
                out,
                "{:<40} {:>12} {:>12} {:>9} {:>12}  {verdict}",
                r.id,
                r.baseline,
                now,
                delta,
                r.limit.floor() as u64
            );
        }
        for (id, now) in &self.untracked {
            let _ = writeln!(
                out,
                "{id:<40} {:>12} {now:>12}  not in the baseline (record it: make icount-baseline)",
                "-"
            );
        }
        out
    }
}

/// Applies the policy of `baseline` to the counts of a run.
pub fn evaluate(baseline: &IcountBaseline, run: &BTreeMap<String, u64>) -> IcountReport {
    let pct = baseline.policy.max_increase_pct;
    let rows = baseline
        .metrics
        .iter()
        .map(|(id, tracked)| {
            let base = tracked.instructions as f64;
            let limit = base * (1.0 + pct / 100.0);
            let now = run.get(id).copied();
            let verdict = match now {
                None => Verdict::Missing,
                Some(n) if n as f64 > limit => Verdict::Regressed,
                Some(_) => Verdict::Ok,
            };
            let improved = now.is_some_and(|n| (n as f64) < base * (1.0 - pct / 100.0));
            IcountRow {
                id: id.clone(),
                baseline: tracked.instructions,
                now,
                limit,
                verdict,
                improved,
            }
        })
        .collect();
    let untracked = run
        .iter()
        .filter(|(id, _)| !baseline.metrics.contains_key(*id))
        .map(|(id, n)| (id.clone(), *n))
        .collect();
    IcountReport { rows, untracked }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One gungraun summary line in the shape of schema version 7, reduced to
    /// the fields the gate reads (plus a neighbour metric that must be ignored).
    fn summary_line(function: &str, id: &str, ir: u64) -> String {
        serde_json::json!({
            "function_name": function,
            "id": id,
            "module_path": format!("icount::hot_paths::{function}"),
            "version": "7",
            "profiles": [{
                "tool": "Callgrind",
                "data": {"total": {"metrics": {
                    "Ir": {"values": {"new": ir}},
                    "EstimatedCycles": {"values": {"new": ir * 2}}
                }}}
            }]
        })
        .to_string()
    }

    fn baseline() -> IcountBaseline {
        serde_json::from_value(serde_json::json!({
            "policy": {"max_increase_pct": 10},
            "metrics": {
                "dispatch/permit_poll": {"instructions": 1000},
                "tenant_lookup/lookup_256": {"instructions": 400}
            }
        }))
        .unwrap()
    }

    fn run(lines: &[String]) -> BTreeMap<String, u64> {
        counts_from_gungraun_json(&lines.join("\n")).unwrap()
    }

    #[test]
    fn reads_gungraun_json_lines() {
        let counts = run(&[
            summary_line("dispatch", "permit_poll", 786),
            summary_line("tenant_lookup", "lookup_256", 396),
        ]);
        assert_eq!(counts["dispatch/permit_poll"], 786);
        assert_eq!(counts["tenant_lookup/lookup_256"], 396);
    }

    #[test]
    fn reads_a_real_gungraun_0_20_summary() {
        // One unedited line of `make icount`'s run file (gungraun-runner 0.20.0).
        let counts =
            counts_from_gungraun_json(include_str!("testdata/gungraun-0.20-summary.jsonl"))
                .unwrap();
        assert_eq!(counts.len(), 1);
        assert!(counts["dispatch/permit_poll"] > 0);
    }

    #[test]
    fn exactly_ten_percent_more_passes() {
        let report = evaluate(
            &baseline(),
            &run(&[
                summary_line("dispatch", "permit_poll", 1100),
                summary_line("tenant_lookup", "lookup_256", 440),
            ]),
        );
        assert!(report.passed(), "{}", report.table());
    }

    #[test]
    fn more_than_ten_percent_fails_and_names_the_path() {
        // The acceptance check: +10.1 % instructions on one tracked hot path.
        let report = evaluate(
            &baseline(),
            &run(&[
                summary_line("dispatch", "permit_poll", 1101),
                summary_line("tenant_lookup", "lookup_256", 400),
            ]),
        );
        assert!(!report.passed());
        let table = report.table();
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("dispatch/permit_poll") && l.ends_with("REGRESSED")),
            "{table}"
        );
        assert!(table
            .lines()
            .any(|l| l.starts_with("tenant_lookup/lookup_256") && l.ends_with("ok")));
    }

    #[test]
    fn a_missing_path_fails_and_an_untracked_one_is_listed() {
        let report = evaluate(
            &baseline(),
            &run(&[
                summary_line("dispatch", "permit_poll", 1000),
                summary_line("snapshot", "read_portable_meta", 4000),
            ]),
        );
        assert!(!report.passed());
        let table = report.table();
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("tenant_lookup/lookup_256")
                    && l.ends_with("MISSING from the run")),
            "{table}"
        );
        assert!(table
            .lines()
            .any(|l| l.starts_with("snapshot/read_portable_meta")
                && l.contains("not in the baseline")));
    }

    #[test]
    fn a_large_improvement_passes_with_a_note() {
        let report = evaluate(
            &baseline(),
            &run(&[
                summary_line("dispatch", "permit_poll", 500),
                summary_line("tenant_lookup", "lookup_256", 400),
            ]),
        );
        assert!(report.passed());
        assert!(report.table().contains("re-record"));
    }

    #[test]
    fn malformed_runs_are_refused() {
        assert!(counts_from_gungraun_json("").is_err());
        assert!(counts_from_gungraun_json("not json").is_err());
        let no_callgrind = serde_json::json!({
            "function_name": "f", "id": "x", "profiles": [{"tool": "DHAT", "data": {}}]
        })
        .to_string();
        assert!(counts_from_gungraun_json(&no_callgrind).is_err());
        let twice = [summary_line("f", "x", 1), summary_line("f", "x", 2)].join("\n");
        assert!(counts_from_gungraun_json(&twice).is_err());
    }

    #[test]
    fn invalid_baselines_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baseline.json");
        std::fs::write(
            &path,
            r#"{"policy":{"max_increase_pct":10},"metrics":{"x":{"instructions":0}}}"#,
        )
        .unwrap();
        assert!(IcountBaseline::load(&path).is_err());
    }

    #[test]
    fn the_committed_baseline_loads_with_the_documented_policy() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench-results/icount/baseline.json");
        let baseline = IcountBaseline::load(&path).unwrap();
        assert_eq!(baseline.policy.max_increase_pct, 10.0);
        assert!(!baseline.metrics.is_empty());
    }
}
