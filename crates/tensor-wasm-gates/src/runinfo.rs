//! What every run file records about its run: machine, UTC date, commit.
//!
//! The same fields, spelled the same way, as `scripts/criterion_summary.py`
//! writes, so that `scripts/perf_doc.py` prints every table's provenance alike.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The machine a run was taken on.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Machine {
    /// `model name` of `/proc/cpuinfo`.
    pub cpu: String,
    /// Logical cores available to the process.
    pub cores: usize,
    /// `<ostype> <osrelease>`, e.g. `Linux 6.18.44`.
    pub kernel: String,
    pub arch: &'static str,
}

/// The machine this process runs on (fields it cannot read say `unknown`).
pub fn machine() -> Machine {
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

/// `git rev-parse HEAD` of the working directory, with `-dirty` when `crates/`
/// differs from it; `unknown` outside a repository.
pub fn commit() -> String {
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

/// The first line of `program args` on stdout, or `unknown`.
pub fn tool_version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
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
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(0);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(0);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_413), (2025, 11, 21));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn now_is_well_formed() {
        let now = utc_now();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
    }
}
