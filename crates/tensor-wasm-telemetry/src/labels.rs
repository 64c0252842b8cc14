//! Bounded label values for per-tenant and per-function metrics.
//!
//! A Prometheus series exists for every label value ever used, and tenants
//! and functions come and go by API call: unbounded, they would grow the
//! scrape without end. The first [`max_tenants`] tenant ids and the first
//! [`max_functions`] function ids seen by this process get series of their
//! own; the rest are counted under [`OTHER`]. The limits are set once at
//! start (`--metrics-max-tenants`, `--metrics-max-functions`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, PoisonError, RwLock};

/// The label value of everything past a limit.
pub const OTHER: &str = "other";
/// Tenants with series of their own, by default.
pub const DEFAULT_MAX_TENANTS: usize = 500;
/// Functions with series of their own, by default (over all tenants).
pub const DEFAULT_MAX_FUNCTIONS: usize = 2000;

struct Budget {
    max: AtomicUsize,
    seen: LazyLock<RwLock<HashSet<Box<str>>>>,
}

impl Budget {
    const fn new(max: usize) -> Self {
        Budget {
            max: AtomicUsize::new(max),
            seen: LazyLock::new(|| RwLock::new(HashSet::new())),
        }
    }

    fn label<'a>(&self, value: &'a str) -> &'a str {
        if self
            .seen
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(value)
        {
            return value;
        }
        let mut seen = self.seen.write().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(value) {
            return value;
        }
        if seen.len() >= self.max.load(Ordering::Relaxed) || value == OTHER {
            return OTHER;
        }
        seen.insert(value.into());
        value
    }
}

static TENANTS: Budget = Budget::new(DEFAULT_MAX_TENANTS);
static FUNCTIONS: Budget = Budget::new(DEFAULT_MAX_FUNCTIONS);

/// Sets the limits (at start, before any series is made).
pub fn configure(max_tenants: usize, max_functions: usize) {
    TENANTS.max.store(max_tenants, Ordering::Relaxed);
    FUNCTIONS.max.store(max_functions, Ordering::Relaxed);
}

/// The tenant label limit in force.
pub fn max_tenants() -> usize {
    TENANTS.max.load(Ordering::Relaxed)
}

/// The function label limit in force.
pub fn max_functions() -> usize {
    FUNCTIONS.max.load(Ordering::Relaxed)
}

/// The label value of tenant `id`: itself, or [`OTHER`] past the limit.
pub fn tenant(id: &str) -> &str {
    TENANTS.label(id)
}

/// The label value of function `id`: itself, or [`OTHER`] past the limit.
pub fn function(id: &str) -> &str {
    FUNCTIONS.label(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_limit_share_one_label() {
        let budget = Budget::new(2);
        assert_eq!(budget.label("a"), "a");
        assert_eq!(budget.label("b"), "b");
        assert_eq!(budget.label("c"), OTHER);
        // The first ones keep their own.
        assert_eq!(budget.label("a"), "a");
        // Nobody can take `other` as a name of its own.
        assert_eq!(Budget::new(5).label(OTHER), OTHER);
    }
}
