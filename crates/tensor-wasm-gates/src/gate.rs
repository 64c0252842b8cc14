//! The performance gate: compares a run's Criterion medians with
//! `bench-results/baseline.json` and decides pass or fail.
//!
//! A tracked metric regresses when its median exceeds
//! `median_ns × (1 + (tolerance_pct + regress_pct_threshold) / 100)`. A
//! tracked metric missing from the run fails the gate too (a bench that stops
//! running must not hide a regression); metrics measured but not tracked are
//! listed so they can enter the baseline in a commit of their own.
//!
//! Confirmation: on a shared machine one run's median of a sub-5 µs metric can
//! spike by half and not repeat in the next run. So when metrics regress (and
//! none is missing), [`gate_criterion_dir`] re-runs exactly those ids once and
//! fails only for the ones that regress again ([`confirm`]); a real slowdown
//! regresses both times. A missing metric fails at once: no re-run can
//! change that.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

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
    Ok(criterion_results(dir)?
        .into_iter()
        .map(|(id, (median, _))| (id, median))
        .collect())
}

/// Median and `new/` directory of every bench id under a Criterion output directory.
fn criterion_results(dir: &Path) -> anyhow::Result<BTreeMap<String, (f64, PathBuf)>> {
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
        out.insert(id, (median, new_dir.to_owned()));
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
    /// The median the verdict is about (of the re-run, for a re-run metric).
    pub now_ns: Option<f64>,
    pub limit_ns: f64,
    pub verdict: Verdict,
    /// For a metric re-run to confirm a regression: its first run's median.
    pub first_ns: Option<f64>,
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

    /// The ids a confirmation re-run measures: the regressed ones. None when a
    /// tracked metric is missing, since the gate fails whatever a re-run shows.
    pub fn to_confirm(&self) -> Vec<&str> {
        if self.rows.iter().any(|r| r.verdict == Verdict::Missing) {
            return Vec::new();
        }
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regressed)
            .map(|r| r.id.as_str())
            .collect()
    }

    /// The table printed by `bench-gate`: every tracked metric, then the
    /// untracked ids.
    pub fn table(&self) -> String {
        let mut out = self.rows_table();
        for id in &self.untracked {
            let why = if is_peer(id) {
                "peer, measured for a ratio only (never tracked)"
            } else {
                "not in the baseline (add it in its own commit)"
            };
            let _ = writeln!(out, "{id:<48} {why}");
        }
        out
    }

    /// The tracked metrics only (after a re-run, the untracked ids were
    /// listed with the first table already).
    pub fn rows_table(&self) -> String {
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
            let verdict = match (r.verdict, r.first_ns) {
                (Verdict::Ok, None) => "ok".to_owned(),
                (Verdict::Regressed, None) => "REGRESSED".to_owned(),
                (Verdict::Missing, None) => "MISSING from the run".to_owned(),
                (Verdict::Ok, Some(first)) => format!("ok after re-run (first {first:.1} ns)"),
                (Verdict::Regressed, Some(first)) => {
                    format!("REGRESSED twice (first {first:.1} ns)")
                }
                (Verdict::Missing, Some(first)) => {
                    format!("MISSING from the re-run (first {first:.1} ns)")
                }
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
        out
    }
}

/// Whether `id` is a peer measured only for a ratio (a memcpy, a `Vec`, raw
/// wasmtime): it times the host, not TensorWasm, so `scripts/make_baseline.py`
/// never tracks it (same markers there).
pub fn is_peer(id: &str) -> bool {
    ["_vec_peer", "raw_wasmtime", "/memcpy/"]
        .iter()
        .any(|marker| id.contains(marker))
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
            Row {
                id: id.clone(),
                baseline_ns: tracked.median_ns,
                now_ns,
                limit_ns,
                verdict: judge(now_ns, limit_ns),
                first_ns: None,
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

fn judge(now_ns: Option<f64>, limit_ns: f64) -> Verdict {
    match now_ns {
        None => Verdict::Missing,
        Some(now) if now > limit_ns => Verdict::Regressed,
        Some(_) => Verdict::Ok,
    }
}

/// The final report after the confirmation re-run: every metric `first` found
/// regressed is judged again, against the same limit, on its median in
/// `rerun` (missing there: it fails as missing from the re-run); every other
/// row stays as it was. Re-judged rows keep their first median in
/// [`Row::first_ns`].
pub fn confirm(first: &Report, rerun: &BTreeMap<String, f64>) -> Report {
    let rows = first
        .rows
        .iter()
        .map(|row| {
            if row.verdict != Verdict::Regressed {
                return row.clone();
            }
            let now_ns = rerun.get(&row.id).copied();
            Row {
                now_ns,
                verdict: judge(now_ns, row.limit_ns),
                first_ns: row.now_ns,
                ..row.clone()
            }
        })
        .collect();
    Report {
        rows,
        untracked: first.untracked.clone(),
    }
}

/// Re-measures the given bench ids into the Criterion directory the gate
/// reads (`bench-gate --rerun` runs the bench command with a filter).
pub type Rerun<'a> = dyn FnMut(&[&str]) -> anyhow::Result<()> + 'a;

/// The gate over a Criterion output directory, with its confirmation re-run:
/// prints the table to `out`; when metrics regressed (and none is missing) and
/// `rerun` is given, says which ids are re-run, calls `rerun` once with them,
/// re-reads their medians from `dir` and prints the final table. Returns
/// whether the gate passes.
///
/// Before the re-run the regressed ids' `new/estimates.json` are removed, so
/// that an id the re-run does not measure fails as missing from the re-run
/// instead of being judged on its first median again. (Criterion compares a
/// run with `base/`, not `new/`, so its own output is unaffected.)
pub fn gate_criterion_dir(
    baseline: &Baseline,
    dir: &Path,
    rerun: Option<&mut Rerun<'_>>,
    out: &mut dyn io::Write,
) -> anyhow::Result<bool> {
    let results = criterion_results(dir)?;
    let medians = results
        .iter()
        .map(|(id, (median, _))| (id.clone(), *median))
        .collect();
    let first = evaluate(baseline, &medians);
    write!(out, "{}", first.table())?;
    if first.passed() {
        return Ok(true);
    }
    let missing: Vec<&str> = first
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Missing)
        .map(|r| r.id.as_str())
        .collect();
    if !missing.is_empty() {
        writeln!(
            out,
            "bench-gate: missing from the run: {} (no re-run: it cannot change the outcome)",
            missing.join(", ")
        )?;
        return Ok(false);
    }
    let Some(rerun) = rerun else {
        return Ok(false);
    };
    let ids = first.to_confirm();
    writeln!(
        out,
        "bench-gate: re-running {} regressed metric(s) once to confirm (a real slowdown \
         regresses again): {}",
        ids.len(),
        ids.join(", ")
    )?;
    out.flush()?;
    for id in &ids {
        let estimates = results[*id].1.join("estimates.json");
        match std::fs::remove_file(&estimates) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", estimates.display()));
            }
            _ => {}
        }
    }
    rerun(&ids).context("the confirmation re-run")?;
    let again = medians_from_criterion_dir(dir)?;
    let last = confirm(&first, &again);
    writeln!(out, "bench-gate: after the re-run:")?;
    write!(out, "{}", last.rows_table())?;
    Ok(last.passed())
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
    fn peers_are_listed_as_never_tracked() {
        let run = BTreeMap::from([
            ("e2e/healthz/get".to_owned(), 900.0),
            ("dispatch/serial/1".to_owned(), 100.0),
            ("instantiate/raw_wasmtime".to_owned(), 2000.0),
            ("memory_bandwidth/sequential_vec_peer/4096".to_owned(), 30.0),
            ("cold_start/memcpy/1048576".to_owned(), 9000.0),
        ]);
        let table = evaluate(&baseline(), &run).table();
        for peer in [
            "instantiate/raw_wasmtime",
            "memory_bandwidth/sequential_vec_peer/4096",
            "cold_start/memcpy/1048576",
        ] {
            assert!(line(&table, peer).ends_with("(never tracked)"), "{table}");
        }
        assert!(!table.contains("not in the baseline"), "{table}");
    }

    /// Writes a result of `id` as Criterion lays it out under `dir`.
    fn write_result(dir: &Path, id: &str, median_ns: f64) {
        let new = dir.join(id).join("new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            serde_json::json!({ "full_id": id }).to_string(),
        )
        .unwrap();
        std::fs::write(
            new.join("estimates.json"),
            serde_json::json!({"median": {"point_estimate": median_ns}}).to_string(),
        )
        .unwrap();
    }

    /// `e2e/healthz/get` (limit 1400 ns) over its limit at 1401 ns.
    fn one_regressed() -> Report {
        let run = BTreeMap::from([
            ("e2e/healthz/get".to_owned(), 1401.0),
            ("dispatch/serial/1".to_owned(), 100.0),
        ]);
        evaluate(&baseline(), &run)
    }

    fn line<'a>(table: &'a str, id: &str) -> &'a str {
        table
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no row {id} in\n{table}"))
    }

    #[test]
    fn a_spike_that_passes_on_the_rerun_passes() {
        let first = one_regressed();
        assert_eq!(first.to_confirm(), ["e2e/healthz/get"]);
        let last = confirm(
            &first,
            &BTreeMap::from([("e2e/healthz/get".to_owned(), 1100.0)]),
        );
        assert!(last.passed(), "{}", last.table());
        let table = last.rows_table();
        assert!(
            line(&table, "e2e/healthz/get").ends_with("ok after re-run (first 1401.0 ns)"),
            "{table}"
        );
        assert!(line(&table, "e2e/healthz/get").contains("1100.0 ns"));
        assert!(line(&table, "dispatch/serial/1").ends_with("  ok"));
    }

    #[test]
    fn a_repeated_regression_fails_naming_the_metric() {
        let first = one_regressed();
        let last = confirm(
            &first,
            &BTreeMap::from([("e2e/healthz/get".to_owned(), 1500.0)]),
        );
        assert!(!last.passed());
        let table = last.rows_table();
        assert!(
            line(&table, "e2e/healthz/get").ends_with("REGRESSED twice (first 1401.0 ns)"),
            "{table}"
        );
        assert!(line(&table, "dispatch/serial/1").ends_with("  ok"));
    }

    #[test]
    fn only_regressed_metrics_are_rejudged_and_one_the_rerun_lacks_fails() {
        let first = one_regressed();
        // The re-run did not measure the regressed metric; a value for a
        // metric that passed the first time changes nothing.
        let last = confirm(
            &first,
            &BTreeMap::from([("dispatch/serial/1".to_owned(), 9999.0)]),
        );
        assert!(!last.passed());
        let table = last.rows_table();
        assert!(
            line(&table, "e2e/healthz/get").ends_with("MISSING from the re-run (first 1401.0 ns)"),
            "{table}"
        );
        assert!(line(&table, "dispatch/serial/1").contains("100.0 ns"));
    }

    #[test]
    fn a_missing_metric_fails_without_a_rerun() {
        // dispatch/serial/1 missing, e2e/healthz/get regressed.
        let dir = tempfile::tempdir().unwrap();
        write_result(dir.path(), "e2e/healthz/get", 5000.0);
        let first = evaluate(
            &baseline(),
            &medians_from_criterion_dir(dir.path()).unwrap(),
        );
        assert!(first.to_confirm().is_empty());

        let mut calls = 0;
        let mut rerun = |_: &[&str]| -> anyhow::Result<()> {
            calls += 1;
            Ok(())
        };
        let mut out = Vec::new();
        let passed =
            gate_criterion_dir(&baseline(), dir.path(), Some(&mut rerun), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!passed, "{out}");
        assert_eq!(calls, 0, "{out}");
        assert!(
            out.contains("missing from the run: dispatch/serial/1 (no re-run"),
            "{out}"
        );
    }

    #[test]
    fn the_gate_confirms_through_a_criterion_directory() {
        let dir = tempfile::tempdir().unwrap();
        write_result(dir.path(), "e2e/healthz/get", 5000.0);
        write_result(dir.path(), "dispatch/serial/1", 100.0);
        write_result(dir.path(), "jit_compile/cache/warm_hit", 60.0);

        // A spike: the re-run measures 1100 ns.
        let mut asked = Vec::new();
        let mut rerun = |ids: &[&str]| -> anyhow::Result<()> {
            asked = ids.iter().map(|id| id.to_string()).collect();
            write_result(dir.path(), "e2e/healthz/get", 1100.0);
            Ok(())
        };
        let mut out = Vec::new();
        let passed =
            gate_criterion_dir(&baseline(), dir.path(), Some(&mut rerun), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(passed, "{out}");
        assert_eq!(asked, ["e2e/healthz/get"]);
        let (first, last) = out.split_once("bench-gate: re-running").expect(&out);
        assert!(
            line(first, "e2e/healthz/get").ends_with("REGRESSED"),
            "{out}"
        );
        assert!(
            first.contains("jit_compile/cache/warm_hit") && first.contains("not in the baseline")
        );
        assert!(
            line(last, "e2e/healthz/get").ends_with("ok after re-run (first 5000.0 ns)"),
            "{out}"
        );
        assert!(!last.contains("not in the baseline"), "{out}");

        // A real slowdown: the re-run regresses again.
        write_result(dir.path(), "e2e/healthz/get", 5000.0);
        let mut rerun = |_: &[&str]| -> anyhow::Result<()> {
            write_result(dir.path(), "e2e/healthz/get", 4800.0);
            Ok(())
        };
        let mut out = Vec::new();
        let passed =
            gate_criterion_dir(&baseline(), dir.path(), Some(&mut rerun), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!passed, "{out}");
        assert!(
            line(
                out.split_once("after the re-run").unwrap().1,
                "e2e/healthz/get"
            )
            .ends_with("REGRESSED twice (first 5000.0 ns)"),
            "{out}"
        );

        // A re-run that measures nothing: the first median is not reused.
        write_result(dir.path(), "e2e/healthz/get", 5000.0);
        let mut rerun = |_: &[&str]| -> anyhow::Result<()> { Ok(()) };
        let mut out = Vec::new();
        let passed =
            gate_criterion_dir(&baseline(), dir.path(), Some(&mut rerun), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!passed, "{out}");
        assert!(
            out.contains("MISSING from the re-run (first 5000.0 ns)"),
            "{out}"
        );

        // Without a re-run the first verdict stands.
        let mut out = Vec::new();
        assert!(!gate_criterion_dir(&baseline(), dir.path(), None, &mut out).unwrap());
    }

    #[test]
    fn reads_a_doctored_criterion_directory() {
        let dir = tempfile::tempdir().unwrap();
        write_result(dir.path(), "e2e/healthz/get", 5000.0);
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
