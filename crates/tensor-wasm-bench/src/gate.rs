//! The performance gate: compares a run's Criterion medians with
//! `bench-results/baseline.json` and decides pass or fail.
//!
//! A tracked metric regresses when its median exceeds
//! `median_ns × (1 + (tolerance_pct + regress_pct_threshold) / 100)`. A
//! tracked metric missing from the run fails the gate too (a bench that stops
//! running must not hide a regression); metrics measured but not tracked are
//! listed so they can enter the baseline in a commit of their own.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context as _};
use serde::Deserialize;
use serde_json::Value;

/// One tracked metric of the baseline.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Tracked {
    pub median_ns: f64,
    pub tolerance_pct: f64,
}

/// The regression policy.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Policy {
    pub regress_pct_threshold: f64,
}

/// `bench-results/baseline.json` (other fields — machine, method — are for people).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Baseline {
    pub policy: Policy,
    pub metrics: BTreeMap<String, Tracked>,
}

impl Baseline {
    /// Reads and checks a baseline file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let baseline: Baseline =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        for (id, m) in &baseline.metrics {
            if !(m.median_ns > 0.0 && m.tolerance_pct >= 0.0) {
                bail!("baseline metric {id}: median_ns must be > 0 and tolerance_pct >= 0");
            }
        }
        Ok(baseline)
    }
}

/// Medians of a run by bench id, from Criterion's output directory
/// (`<dir>/**/new/estimates.json` with its `benchmark.json`).
pub fn medians_from_criterion_dir(dir: &Path) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    walk(dir, &mut |new_dir| {
        let bench: Value = read_json(&new_dir.join("benchmark.json"))?;
        let est: Value = read_json(&new_dir.join("estimates.json"))?;
        let id = bench["full_id"]
            .as_str()
            .context("benchmark.json without full_id")?
            .to_owned();
        let median = est["median"]["point_estimate"]
            .as_f64()
            .context("estimates.json without median.point_estimate")?;
        out.insert(id, median);
        Ok(())
    })?;
    Ok(out)
}

/// Medians from a run file written by `scripts/criterion_summary.py`.
pub fn medians_from_summary(path: &Path) -> anyhow::Result<BTreeMap<String, f64>> {
    let doc: Value = read_json(path)?;
    let benches = doc["benches"].as_object().context("no `benches` object")?;
    benches
        .iter()
        .map(|(id, b)| {
            let median = b["median_ns"]
                .as_f64()
                .with_context(|| format!("{id}: no median_ns"))?;
            Ok((id.clone(), median))
        })
        .collect()
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn walk(dir: &Path, visit: &mut dyn FnMut(&Path) -> anyhow::Result<()>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") && path.join("estimates.json").exists() {
            visit(&path)?;
        } else {
            walk(&path, visit)?;
        }
    }
    Ok(())
}

/// What the gate decided about one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Regressed,
    /// Tracked, but the run did not measure it.
    Missing,
}

/// One row of the gate's table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub baseline_ns: f64,
    pub now_ns: Option<f64>,
    pub limit_ns: f64,
    pub verdict: Verdict,
}

/// The gate's decision over a whole run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Measured but not in the baseline.
    pub untracked: Vec<String>,
}

impl Report {
    /// Whether every tracked metric was measured and within its limit.
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.verdict == Verdict::Ok)
    }

    /// The table printed by `bench-gate`.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<48} {:>14} {:>14} {:>9} {:>14}  verdict",
            "metric", "baseline", "now", "delta", "limit"
        );
        for r in &self.rows {
            let (now, delta) = match r.now_ns {
                Some(now) => (
                    format!("{now:.1} ns"),
                    format!("{:+.1}%", (now / r.baseline_ns - 1.0) * 100.0),
                ),
                None => ("-".into(), "-".into()),
            };
            let verdict = match r.verdict {
                Verdict::Ok => "ok",
                Verdict::Regressed => "REGRESSED",
                Verdict::Missing => "MISSING from the run",
            };
            let _ = writeln!(
                out,
                "{:<48} {:>14} {:>14} {:>9} {:>14}  {verdict}",
                r.id,
                format!("{:.1} ns", r.baseline_ns),
                now,
                delta,
                format!("{:.1} ns", r.limit_ns)
            );
        }
        for id in &self.untracked {
            let _ = writeln!(
                out,
                "{id:<48} not in the baseline (add it in its own commit)"
            );
        }
        out
    }
}

/// Applies the policy of `baseline` to the medians of a run.
pub fn evaluate(baseline: &Baseline, run: &BTreeMap<String, f64>) -> Report {
    let rows = baseline
        .metrics
        .iter()
        .map(|(id, tracked)| {
            let factor =
                1.0 + (tracked.tolerance_pct + baseline.policy.regress_pct_threshold) / 100.0;
            let limit_ns = tracked.median_ns * factor;
            let now_ns = run.get(id).copied();
            let verdict = match now_ns {
                None => Verdict::Missing,
                Some(now) if now > limit_ns => Verdict::Regressed,
                Some(_) => Verdict::Ok,
            };
            Row {
                id: id.clone(),
                baseline_ns: tracked.median_ns,
                now_ns,
                limit_ns,
                verdict,
            }
        })
        .collect();
    let untracked = run
        .keys()
        .filter(|id| !baseline.metrics.contains_key(*id))
        .cloned()
        .collect();
    Report { rows, untracked }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn baseline() -> Baseline {
        serde_json::from_value(serde_json::json!({
            "policy": {"regress_pct_threshold": 10},
            "metrics": {
                "e2e/healthz/get": {"median_ns": 1000.0, "tolerance_pct": 30},
                "dispatch/serial/1": {"median_ns": 200.0, "tolerance_pct": 50}
            }
        }))
        .unwrap()
    }

    #[test]
    fn within_tolerance_passes_and_the_limit_is_the_documented_formula() {
        let run = BTreeMap::from([
            ("e2e/healthz/get".to_owned(), 1399.0),
            ("dispatch/serial/1".to_owned(), 100.0),
        ]);
        let report = evaluate(&baseline(), &run);
        assert!(report.passed(), "{}", report.table());
        let healthz = report
            .rows
            .iter()
            .find(|r| r.id == "e2e/healthz/get")
            .unwrap();
        assert!((healthz.limit_ns - 1400.0).abs() < 1e-9);
    }

    #[test]
    fn an_artificial_slowdown_fails_and_names_the_metric() {
        let run = BTreeMap::from([
            ("e2e/healthz/get".to_owned(), 1401.0),
            ("dispatch/serial/1".to_owned(), 200.0),
        ]);
        let report = evaluate(&baseline(), &run);
        assert!(!report.passed());
        let table = report.table();
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("e2e/healthz/get") && l.ends_with("REGRESSED")),
            "{table}"
        );
        assert!(table
            .lines()
            .any(|l| l.starts_with("dispatch/serial/1") && l.ends_with("ok")));
    }

    #[test]
    fn missing_and_untracked_metrics_are_reported() {
        let run = BTreeMap::from([
            ("e2e/healthz/get".to_owned(), 900.0),
            ("jit_compile/cache/warm_hit".to_owned(), 60.0),
        ]);
        let report = evaluate(&baseline(), &run);
        assert!(!report.passed(), "a tracked metric vanished from the run");
        let table = report.table();
        assert!(
            table.contains("dispatch/serial/1") && table.contains("MISSING from the run"),
            "{table}"
        );
        assert!(
            table.contains("jit_compile/cache/warm_hit") && table.contains("not in the baseline")
        );
    }

    #[test]
    fn reads_a_doctored_criterion_directory() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("e2e/healthz/get/new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            r#"{"full_id":"e2e/healthz/get"}"#,
        )
        .unwrap();
        std::fs::write(
            new.join("estimates.json"),
            r#"{"median":{"point_estimate":5000.0}}"#,
        )
        .unwrap();
        let run = medians_from_criterion_dir(dir.path()).unwrap();
        assert_eq!(run.get("e2e/healthz/get"), Some(&5000.0));
        let report = evaluate(&baseline(), &run);
        assert!(!report.passed());
    }

    #[test]
    fn invalid_baselines_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baseline.json");
        std::fs::write(
            &path,
            r#"{"policy":{"regress_pct_threshold":10},"metrics":{"x":{"median_ns":0,"tolerance_pct":5}}}"#,
        )
        .unwrap();
        assert!(Baseline::load(&path).is_err());
    }
}
