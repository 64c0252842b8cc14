//! Bounded waiting for a state, the replacement for `sleep` as synchronisation.
//!
//! A test that needs "the server is ready", "the job is running" or "every
//! quota is released" polls for exactly that state, every [`POLL_INTERVAL`],
//! and fails with a message naming the state once a generous bound passes.
//! On a fast machine the wait ends as soon as the state is reached; on a
//! loaded one it takes longer but does not fail, as a fixed sleep would.
//!
//! The converse, a property that must *keep* holding over a period (a guest
//! whose client does not read stays in flight), is [`assert_holds_for`]:
//! it checks the property all through the window, so load can only make the
//! window longer, never the check weaker.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a wait looks at the state again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Polls `ready` until it returns `true` and returns how long that took;
/// panics naming `what` when `timeout` passes first.
#[track_caller]
pub fn wait_until(timeout: Duration, what: &str, mut ready: impl FnMut() -> bool) -> Duration {
    wait_for(timeout, what, || ready().then_some(())).1
}

/// Polls `probe` until it returns `Some`, and returns that value with how
/// long the wait took; panics naming `what` when `timeout` passes first.
#[track_caller]
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    probe: impl FnMut() -> Option<T>,
) -> (T, Duration) {
    let start = Instant::now();
    match poll_for(timeout, probe) {
        Some(value) => (value, start.elapsed()),
        None => panic!("timed out after {timeout:?} waiting until {what}"),
    }
}

/// Polls `probe` until it returns `Some` and returns that value, or `None`
/// once `timeout` passes: for a caller that reports a timeout itself (with
/// a server log, say).
pub fn poll_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// [`wait_until`] inside a tokio runtime: the predicate is checked between
/// timer ticks, so the tasks under test keep running.
pub async fn wait_until_async(
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if ready() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// [`wait_for`] with an asynchronous probe (a request to the router, say).
pub async fn wait_for_async<T, F>(timeout: Duration, what: &str, mut probe: impl FnMut() -> F) -> T
where
    F: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Asserts that `holds` is true at every check for the whole of `window`.
///
/// This is an observation window, not synchronisation: it proves something
/// does *not* happen for a while (a blocked guest does not finish). A slower
/// machine stretches the window; it cannot make a correct program fail.
#[track_caller]
pub fn assert_holds_for(window: Duration, what: &str, mut holds: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        assert!(
            holds(),
            "{what} stopped holding after {:?}",
            start.elapsed()
        );
        if start.elapsed() >= window {
            return;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// [`assert_holds_for`] inside a tokio runtime.
pub async fn assert_holds_for_async(window: Duration, what: &str, mut holds: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        assert!(
            holds(),
            "{what} stopped holding after {:?}",
            start.elapsed()
        );
        if start.elapsed() >= window {
            return;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn wait_until_returns_once_another_thread_sets_the_state() {
        let flag = Arc::new(AtomicBool::new(false));
        let setter = {
            let flag = flag.clone();
            std::thread::spawn(move || flag.store(true, Ordering::SeqCst))
        };
        wait_until(Duration::from_secs(10), "the flag is set", || {
            flag.load(Ordering::SeqCst)
        });
        setter.join().unwrap();
    }

    #[test]
    #[should_panic(expected = "waiting until the impossible")]
    fn wait_until_fails_naming_the_state() {
        wait_until(Duration::from_millis(20), "the impossible", || false);
    }

    #[test]
    fn wait_for_returns_the_probed_value() {
        let mut calls = 0;
        let (value, _) = wait_for(Duration::from_secs(10), "the third call", || {
            calls += 1;
            (calls == 3).then_some(calls * 10)
        });
        assert_eq!(value, 30);
        assert_eq!(poll_for(Duration::from_millis(20), || None::<()>), None);
    }

    #[test]
    #[should_panic(expected = "the counter stays small stopped holding")]
    fn assert_holds_for_fails_when_the_property_breaks() {
        let counter = AtomicU32::new(0);
        assert_holds_for(Duration::from_secs(10), "the counter stays small", || {
            counter.fetch_add(1, Ordering::SeqCst) < 3
        });
    }

    #[tokio::test]
    async fn async_waits_poll_until_the_state() {
        let mut calls = 0;
        let value = wait_for_async(Duration::from_secs(10), "the second call", || {
            calls += 1;
            let n = calls;
            async move { (n == 2).then_some(n) }
        })
        .await;
        assert_eq!(value, 2);
        let mut left = 3;
        wait_until_async(Duration::from_secs(10), "the countdown ends", || {
            left -= 1;
            left == 0
        })
        .await;
        assert_holds_for_async(Duration::from_millis(20), "always", || true).await;
    }
}
