//! Criterion's positional filter on a bench binary's command line, read back in
//! a bench with its own harness (`benches/tail_latency.rs`) so that it skips
//! what Criterion would skip: the anchored regex `bench-gate` appends to re-run
//! exactly some ids (`tensor_wasm_gates::criterion_filter::exact_ids`) included.
//!
//! Criterion 0.8 compiles the first free argument as a regex (the `regex`
//! crate, as here) and runs the benches whose full id (`group/function/param`)
//! it matches anywhere; with `--exact` the argument must equal the id.

use regex::Regex;

/// Criterion 0.8's options that take a value (the next argument, unless given
/// as `--option=value`); every other option is a flag.
const VALUE_OPTIONS: [&str; 20] = [
    "-c",
    "--color",
    "--colour",
    "-s",
    "--save-baseline",
    "-b",
    "--baseline",
    "--baseline-lenient",
    "--format",
    "--profile-time",
    "--load-baseline",
    "--sample-size",
    "--warm-up-time",
    "--measurement-time",
    "--nresamples",
    "--noise-threshold",
    "--confidence-level",
    "--significance-level",
    "--plotting-backend",
    "--output-format",
];

/// Which benchmarks a bench binary was asked to run.
#[derive(Debug, Clone)]
pub enum BenchFilter {
    /// No filter argument.
    All,
    /// `--ignored`: Criterion runs nothing.
    None,
    /// The filter argument, a regex matched anywhere in the full id.
    Regex(Regex),
    /// The filter argument with `--exact`.
    Exact(String),
}

impl BenchFilter {
    /// Reads the filter from a bench binary's arguments (without the program
    /// name), as Criterion 0.8 does: the first argument that is neither an
    /// option nor an option's value. An invalid regex is an error (Criterion
    /// panics on it).
    pub fn from_args<I, S>(args: I) -> Result<Self, regex::Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut filter = None;
        let (mut exact, mut ignored, mut options_ended) = (false, false, false);
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let arg = arg.as_ref();
            if options_ended || !arg.starts_with('-') || arg == "-" {
                if filter.is_none() {
                    filter = Some(arg.to_owned());
                }
                continue;
            }
            match arg {
                "--" => options_ended = true,
                "--exact" => exact = true,
                "--ignored" => ignored = true,
                _ if VALUE_OPTIONS.contains(&arg) => {
                    args.next();
                }
                _ => {}
            }
        }
        Ok(match filter {
            _ if ignored => Self::None,
            None => Self::All,
            Some(text) if exact => Self::Exact(text),
            Some(text) => Self::Regex(Regex::new(&text)?),
        })
    }

    /// Whether the benchmark with this full id runs.
    pub fn matches(&self, id: &str) -> bool {
        match self {
            Self::All => true,
            Self::None => false,
            Self::Regex(regex) => regex.is_match(id),
            Self::Exact(exact) => id == exact,
        }
    }

    /// The filter as given, for a record of what ran (`None` without one).
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::All => None,
            Self::None => Some("--ignored"),
            Self::Regex(regex) => Some(regex.as_str()),
            Self::Exact(exact) => Some(exact),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(args: &[&str]) -> BenchFilter {
        BenchFilter::from_args(args).unwrap()
    }

    #[test]
    fn the_gates_exact_ids_filter_reads_back_as_exactly_those_ids() {
        let pattern = tensor_wasm_gates::criterion_filter::exact_ids(&[
            "jit_compile/emit_text/matmul[16x16x16]",
            "dispatch/serial/1",
        ]);
        assert_eq!(
            pattern,
            r"^(jit_compile/emit_text/matmul\[16x16x16\]|dispatch/serial/1)$"
        );
        let f = filter(&["--bench", &pattern]);
        assert!(f.matches("jit_compile/emit_text/matmul[16x16x16]"));
        assert!(f.matches("dispatch/serial/1"));
        // Unanchored, `dispatch/serial/1` would also pick these.
        assert!(!f.matches("dispatch/serial/10"));
        assert!(!f.matches("dispatch/serial/1000"));
        assert!(!f.matches("jit_compile/emit_text/matmul1"));
        assert!(!f.matches("xdispatch/serial/1"));
    }

    #[test]
    fn the_ci_bench_command_line_has_no_filter() {
        let f = filter(&["--bench", "--warm-up-time", "1", "--measurement-time", "3"]);
        assert!(matches!(f, BenchFilter::All));
        assert!(f.matches("e2e/healthz/get"));
        assert_eq!(f.text(), None);
    }

    #[test]
    fn option_values_are_not_taken_for_the_filter() {
        let f = filter(&[
            "--bench",
            "--warm-up-time",
            "1",
            "--sample-size=20",
            "-s",
            "mine",
            "--output-format",
            "bencher",
            "e2e/",
        ]);
        assert_eq!(f.text(), Some("e2e/"));
        assert!(f.matches("e2e/healthz/get"));
        assert!(!f.matches("dispatch/serial/100"));
    }

    #[test]
    fn exact_and_ignored_follow_criterion() {
        let f = filter(&["--exact", "e2e/healthz/get"]);
        assert!(f.matches("e2e/healthz/get"));
        assert!(!f.matches("e2e/healthz/get/x"));
        let f = filter(&["--bench", "--ignored", "e2e"]);
        assert!(!f.matches("e2e/healthz/get"));
    }

    #[test]
    fn an_invalid_regex_is_an_error() {
        assert!(BenchFilter::from_args(["--bench", "(unclosed"]).is_err());
    }
}
