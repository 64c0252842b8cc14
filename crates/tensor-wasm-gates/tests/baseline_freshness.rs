//! The wall-clock gate tracks what the code does now.
//!
//! - `bench-results/baseline.json` does not lag the committed runs: for every tracked bench id,
//!   the newest committed Criterion run file (`bench-results/criterion/*.json`, by its date)
//!   that measured it is not 2× faster than the baseline or more. A baseline that far behind
//!   would let the code slow down again by half without the gate noticing; refresh it with
//!   `scripts/make_baseline.py --refresh` from the runs that show the move.
//! - Every bench id of the performance document the project was specified from
//!   (`bench-results/specified-bench-ids.txt`, names only) exists: measured in a committed run
//!   file, or marked there as not gated with the reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// How much faster than its baseline the newest committed run of a bench may be.
const LAG_LIMIT: f64 = 2.0;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Per bench id, the newest committed run's (date, median ns, file).
fn newest_runs() -> BTreeMap<String, (String, f64, String)> {
    let mut newest: BTreeMap<String, (String, f64, String)> = BTreeMap::new();
    let dir = repo().join("bench-results/criterion");
    for entry in std::fs::read_dir(&dir).expect("bench-results/criterion") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let run = json(&path);
        if run["kind"] != "criterion" {
            continue;
        }
        let date = run["date"].as_str().unwrap_or_default().to_owned();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(benches) = run["benches"].as_object() else {
            continue;
        };
        for (id, bench) in benches {
            let Some(median) = bench["median_ns"].as_f64() else {
                continue;
            };
            let newer = newest
                .get(id)
                .is_none_or(|(d, _, f)| (date.as_str(), file.as_str()) > (d.as_str(), f.as_str()));
            if newer {
                newest.insert(id.clone(), (date.clone(), median, file.clone()));
            }
        }
    }
    newest
}

/// The ids of `baseline` (a baseline.json document) whose newest committed run in `newest` is
/// `LAG_LIMIT` times faster or more, each with what shows it.
fn lagging(baseline: &Value, newest: &BTreeMap<String, (String, f64, String)>) -> Vec<String> {
    let mut lagging = Vec::new();
    for (id, metric) in baseline["metrics"].as_object().expect("metrics") {
        let base = metric["median_ns"].as_f64().expect("median_ns");
        if let Some((date, median, file)) = newest.get(id) {
            if base / median >= LAG_LIMIT {
                lagging.push(format!(
                    "{id}: baseline {base:.1} ns, {file} ({date}) measured {median:.1} ns, \
                     {:.2}x faster",
                    base / median
                ));
            }
        }
    }
    lagging
}

#[test]
fn the_baseline_does_not_lag_the_newest_committed_runs() {
    let baseline = json(&repo().join("bench-results/baseline.json"));
    let lagging = lagging(&baseline, &newest_runs());
    assert!(
        lagging.is_empty(),
        "the baseline lags the code (refresh it: scripts/make_baseline.py --refresh \
         bench-results/baseline.json bench-results/baseline.json <the newest runs>):\n{}",
        lagging.join("\n")
    );
}

/// The check itself, on a baseline made up from the committed runs: a metric twice as slow
/// as its newest run is caught, one 1.9 times as slow is not, nor one without a run.
#[test]
fn a_baseline_twice_as_slow_as_the_newest_run_is_caught() {
    let newest = newest_runs();
    let (id, (_, median, _)) = newest
        .iter()
        .find(|(id, _)| id.starts_with("dispatch/serial/"))
        .expect("a committed dispatch run");
    let made_up = |factor: f64| {
        serde_json::json!({"metrics": {
            id.clone(): {"median_ns": median * factor},
            "no/such/bench": {"median_ns": 1e12},
        }})
    };
    assert_eq!(lagging(&made_up(2.0), &newest).len(), 1);
    assert!(lagging(&made_up(1.9), &newest).is_empty());
}

#[test]
fn every_specified_bench_id_exists() {
    let list = std::fs::read_to_string(repo().join("bench-results/specified-bench-ids.txt"))
        .expect("bench-results/specified-bench-ids.txt");
    let newest = newest_runs();
    let mut missing = Vec::new();
    for line in list.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `id` or `id  # not gated: why`.
        let (id, note) = line
            .split_once('#')
            .map_or((line, ""), |(i, n)| (i.trim(), n));
        if note.trim_start().starts_with("not gated:") {
            assert!(
                note.len() > "not gated:".len() + 3,
                "{id}: a bench that is not gated says why"
            );
            continue;
        }
        if !newest.contains_key(id) {
            missing.push(id.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "specified bench ids with no committed run (bench-results/criterion/*.json): {missing:?}"
    );
}
