//! Request ids: `x-request-id` is kept when the client sends a usable one,
//! otherwise generated; it is echoed in the response and named in the logs.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::HeaderValue;

/// The header carrying the id.
pub(crate) const HEADER: &str = "x-request-id";

/// Generates `<process prefix>-<counter>` ids: unique per process, cheap.
#[derive(Debug)]
pub(crate) struct RequestIds {
    prefix: String,
    next: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        let mut raw = [0u8; 4];
        // A clash of prefixes between restarts only makes ids less unique in logs.
        if getrandom::fill(&mut raw).is_err() {
            raw = std::process::id().to_le_bytes();
        }
        RequestIds {
            prefix: raw.iter().map(|b| format!("{b:02x}")).collect(),
            next: AtomicU64::new(1),
        }
    }
}

impl RequestIds {
    /// The next id.
    pub(crate) fn next(&self) -> HeaderValue {
        use std::fmt::Write as _;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Written once, handed to the header without a copy.
        let mut id = String::with_capacity(self.prefix.len() + 21);
        id.push_str(&self.prefix);
        let _ = write!(id, "-{n}");
        HeaderValue::from_maybe_shared(axum::body::Bytes::from(id)).expect("ids are ASCII")
    }
}

/// Whether a client-sent id is worth keeping: short, visible ASCII.
pub(crate) fn acceptable(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_client_ids_are_checked() {
        let ids = RequestIds::default();
        assert_ne!(ids.next(), ids.next());
        assert!(acceptable(&HeaderValue::from_static("abc-123")));
        assert!(!acceptable(&HeaderValue::from_static("")));
        assert!(!acceptable(&HeaderValue::from_static("has space")));
        assert!(!acceptable(
            &HeaderValue::from_str(&"x".repeat(200)).unwrap()
        ));
    }
}
