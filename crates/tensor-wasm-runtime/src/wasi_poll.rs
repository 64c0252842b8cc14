//! `wasi_snapshot_preview1::poll_oneoff` in place of wasmtime-wasi's, with the same answers but
//! sleeps that end at the invocation's deadline.
//!
//! wasmtime-wasi sleeps on a timer nothing can cut short, and the epoch deadline only stops
//! guest code: a guest that asked to sleep for a day would keep its thread, its instance slot
//! and its tenant's quotas for a day after its client was answered `invocation_timeout`. Here a
//! poll that would still be waiting at the deadline wakes then and ends the invocation as a
//! timeout ([`DeadlineExceeded`]).
//!
//! The answers follow wasmtime-wasi 48's: clock subscriptions on the realtime and monotonic
//! clocks, relative or absolute (any other clock is `EINVAL`); `fd_read` on stdin and `fd_write`
//! on stdout/stderr are ready at once with `nbytes` 1 (a guest's only descriptors are those
//! three in-memory streams: a poll naming one returns without sleeping); any other descriptor
//! is `EBADF` for the whole call. Ready events are written in subscription order.
//!
//! Absolute monotonic times are on [`ProcessClock`], the monotonic clock every guest is given,
//! so this module knows when they fall due.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wasmtime::{Caller, Linker};
use wasmtime_wasi::HostMonotonicClock;

use crate::invocation_state::{DeadlineExceeded, InvocationState};

const MODULE: &str = "wasi_snapshot_preview1";

/// WASI preview 1 layout: `subscription` is 48 bytes, `event` 32.
const SUBSCRIPTION_SIZE: usize = 48;
const EVENT_SIZE: usize = 32;

/// `errno` values.
mod errno {
    pub(super) const SUCCESS: i32 = 0;
    pub(super) const BADF: i32 = 8;
    pub(super) const FAULT: i32 = 21;
    pub(super) const INVAL: i32 = 28;
}

/// `eventtype` values.
const CLOCK: u8 = 0;
const FD_READ: u8 = 1;
const FD_WRITE: u8 = 2;

/// `clockid` values.
const REALTIME: u32 = 0;
const MONOTONIC: u32 = 1;

/// `subclockflags::subscription_clock_abstime`.
const ABSTIME: u16 = 1;

/// The monotonic clock guests read: nanoseconds since the first time any guest asked.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcessClock;

impl ProcessClock {
    fn origin() -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }

    /// The instant `nanos` on this clock stands for.
    pub(crate) fn instant(nanos: u64) -> Instant {
        let origin = Self::origin();
        origin
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or_else(|| origin + Duration::from_secs(100 * 365 * 86_400))
    }
}

impl HostMonotonicClock for ProcessClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        u64::try_from(Self::origin().elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What one subscription waits for.
enum Wait {
    /// Ready now: an event of this type.
    Ready(u8),
    /// A clock that falls due at this instant.
    Until(Instant),
}

/// Replaces wasmtime-wasi's `poll_oneoff` in `linker` (added after it).
pub(crate) fn add_to_linker(linker: &mut Linker<InvocationState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let added = linker
        .func_wrap(MODULE, "poll_oneoff", poll_oneoff)
        .map(|_| ());
    linker.allow_shadowing(false);
    added
}

fn poll_oneoff(
    mut caller: Caller<'_, InvocationState>,
    subscriptions: i32,
    events: i32,
    count: i32,
    count_out: i32,
) -> wasmtime::Result<i32> {
    let Some(memory) = caller
        .get_export("memory")
        .and_then(wasmtime::Extern::into_memory)
    else {
        return Err(wasmtime::Error::msg("missing required memory export"));
    };
    let deadline = caller.data().deadline;
    let count = count as u32 as usize;
    if count == 0 {
        return Ok(errno::INVAL);
    }
    let read = |caller: &Caller<'_, InvocationState>| -> Option<Vec<u8>> {
        let start = subscriptions as u32 as usize;
        let end = start.checked_add(count.checked_mul(SUBSCRIPTION_SIZE)?)?;
        memory.data(caller).get(start..end).map(<[u8]>::to_vec)
    };
    let Some(table) = read(&caller) else {
        return Ok(errno::FAULT);
    };
    let now = Instant::now();
    let mut waits = Vec::with_capacity(count);
    for sub in table.chunks_exact(SUBSCRIPTION_SIZE) {
        let u32_at = |at: usize| u32::from_le_bytes(sub[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(sub[at..at + 8].try_into().unwrap_or([0; 8]));
        let wait = match sub[8] {
            CLOCK => {
                let (id, timeout) = (u32_at(16), u64_at(24));
                let absolute = u16::from_le_bytes([sub[40], sub[41]]) & ABSTIME != 0;
                let due = match (id, absolute) {
                    (REALTIME | MONOTONIC, false) => now.checked_add(Duration::from_nanos(timeout)),
                    (MONOTONIC, true) => Some(ProcessClock::instant(timeout)),
                    (REALTIME, true) => {
                        let target = UNIX_EPOCH + Duration::from_nanos(timeout);
                        let left = target
                            .duration_since(SystemTime::now())
                            .unwrap_or(Duration::ZERO);
                        now.checked_add(left)
                    }
                    _ => return Ok(errno::INVAL),
                };
                // Past any deadline (centuries away): the deadline comes first anyway.
                Wait::Until(due.unwrap_or(deadline.max(now)))
            }
            FD_READ if u32_at(16) == 0 => Wait::Ready(FD_READ),
            FD_WRITE if matches!(u32_at(16), 1 | 2) => Wait::Ready(FD_WRITE),
            FD_READ | FD_WRITE => return Ok(errno::BADF),
            _ => return Ok(errno::INVAL),
        };
        waits.push(wait);
    }
    let any_ready = waits.iter().any(|w| matches!(w, Wait::Ready(_)));
    if !any_ready {
        let first_due = waits
            .iter()
            .filter_map(|w| match w {
                Wait::Until(due) => Some(*due),
                Wait::Ready(_) => None,
            })
            .min()
            .unwrap_or(now);
        if first_due > deadline {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            return Err(DeadlineExceeded.into());
        }
        std::thread::sleep(first_due.saturating_duration_since(Instant::now()));
    }
    let now = Instant::now();
    let mut out = Vec::new();
    for (sub, wait) in table.chunks_exact(SUBSCRIPTION_SIZE).zip(&waits) {
        let (kind, nbytes) = match *wait {
            Wait::Ready(kind) => (kind, 1u64),
            Wait::Until(due) if due <= now => (CLOCK, 0),
            Wait::Until(_) => continue,
        };
        let mut event = [0u8; EVENT_SIZE];
        event[0..8].copy_from_slice(&sub[0..8]);
        event[8..10].copy_from_slice(&(errno::SUCCESS as u16).to_le_bytes());
        event[10] = kind;
        event[16..24].copy_from_slice(&nbytes.to_le_bytes());
        out.extend_from_slice(&event);
    }
    let written = (out.len() / EVENT_SIZE) as u32;
    let memory_bytes = memory.data_mut(&mut caller);
    let events_at = events as u32 as usize;
    let count_at = count_out as u32 as usize;
    let (Some(events_end), Some(count_end)) =
        (events_at.checked_add(out.len()), count_at.checked_add(4))
    else {
        return Ok(errno::FAULT);
    };
    if events_end > memory_bytes.len() || count_end > memory_bytes.len() {
        return Ok(errno::FAULT);
    }
    memory_bytes[events_at..events_end].copy_from_slice(&out);
    memory_bytes[count_at..count_end].copy_from_slice(&written.to_le_bytes());
    Ok(errno::SUCCESS)
}

#[cfg(test)]
mod tests {
    use crate::{DeploySpec, Runtime, RuntimeError};

    use super::*;

    /// `sleep(ns)` polls one relative monotonic clock; `sleep_or_stdout(ns)` polls the same
    /// clock and stdout's writability. Both return the number of events, or minus the errno, or
    /// -1000 when an event is not what the subscription asked for.
    const SLEEPER: &str = r#"(module
      (import "wasi_snapshot_preview1" "poll_oneoff"
        (func $poll (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func $clock (param $at i32) (param $ns i64)
        (i64.store (local.get $at) (i64.const 0x1234))
        (i32.store8 (i32.add (local.get $at) (i32.const 8)) (i32.const 0))
        (i32.store (i32.add (local.get $at) (i32.const 16)) (i32.const 1))
        (i64.store (i32.add (local.get $at) (i32.const 24)) (local.get $ns))
        (i32.store16 (i32.add (local.get $at) (i32.const 40)) (i32.const 0)))
      (func $poll_n (param $n i32) (result i32) (local $err i32)
        (local.set $err
          (call $poll (i32.const 0) (i32.const 256) (local.get $n) (i32.const 512)))
        (if (local.get $err) (then (return (i32.sub (i32.const 0) (local.get $err)))))
        (i32.load (i32.const 512)))
      (func (export "sleep") (param $ns i64) (result i32) (local $n i32)
        (call $clock (i32.const 0) (local.get $ns))
        (local.set $n (call $poll_n (i32.const 1)))
        (if (i32.ne (local.get $n) (i32.const 1)) (then (return (local.get $n))))
        (if (i64.ne (i64.load (i32.const 256)) (i64.const 0x1234))
          (then (return (i32.const -1000))))
        (if (i32.ne (i32.load8_u (i32.const 266)) (i32.const 0))
          (then (return (i32.const -1000))))
        (i32.const 1))
      (func (export "sleep_or_stdout") (param $ns i64) (result i32) (local $n i32)
        (call $clock (i32.const 0) (local.get $ns))
        (i64.store (i32.const 48) (i64.const 0x5678))
        (i32.store8 (i32.const 56) (i32.const 2))
        (i32.store (i32.const 64) (i32.const 1))
        (local.set $n (call $poll_n (i32.const 2)))
        (if (i32.ne (local.get $n) (i32.const 1)) (then (return (local.get $n))))
        (if (i64.ne (i64.load (i32.const 256)) (i64.const 0x5678))
          (then (return (i32.const -1000))))
        (if (i32.ne (i32.load8_u (i32.const 266)) (i32.const 2))
          (then (return (i32.const -1000))))
        (i32.const 1)))"#;

    fn sleeper(dir: &std::path::Path, timeout_ms: u64) -> (Runtime, String) {
        let rt = crate::stream::tests::runtime(dir);
        let spec = DeploySpec {
            timeout_ms: Some(timeout_ms),
            ..DeploySpec::export("sleeper")
        };
        let id = rt.deploy(SLEEPER.as_bytes(), spec).unwrap().record.id;
        (rt, id)
    }

    #[test]
    fn a_short_sleep_sleeps_and_reports_its_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (rt, id) = sleeper(dir.path(), 5_000);
        let start = Instant::now();
        let result = rt.invoke_export(&id, "sleep", &[serde_json::json!(50_000_000)]);
        assert_eq!(result.unwrap(), [serde_json::json!(1)]);
        assert!(start.elapsed() >= Duration::from_millis(50));
        // A ready descriptor ends the poll at once, with its event only.
        let start = Instant::now();
        let result = rt.invoke_export(
            &id,
            "sleep_or_stdout",
            &[serde_json::json!(20_000_000_000u64)],
        );
        assert_eq!(result.unwrap(), [serde_json::json!(1)]);
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    /// wasmtime-wasi's own poll_oneoff would sleep the whole 20 s, holding the thread.
    #[test]
    fn a_sleep_past_the_deadline_ends_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let (rt, id) = sleeper(dir.path(), 300);
        let start = Instant::now();
        let result = rt.invoke_export(&id, "sleep", &[serde_json::json!(20_000_000_000u64)]);
        let took = start.elapsed();
        assert!(
            matches!(result, Err(RuntimeError::Timeout { timeout_ms: 300 })),
            "{result:?}"
        );
        assert!(took >= Duration::from_millis(290), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn the_guests_monotonic_clock_is_the_process_clock() {
        let clock = ProcessClock;
        let first = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        let second = clock.now();
        assert!(second >= first + 2_000_000, "{first} -> {second}");
        let due = ProcessClock::instant(second);
        assert!(due <= Instant::now());
    }
}
