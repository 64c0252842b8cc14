//! Blocking work runs at a lower CPU priority than the async threads.
//!
//! The async threads answer every tenant's cheap calls (inline export calls, job and metadata
//! lookups); the blocking threads run guest code of every tenant, compiles and snapshot
//! captures. On a machine with few cores, one tenant's CPU-heavy guests would otherwise take
//! the CPU from the threads answering another tenant's short requests for whole scheduler
//! slices. Lowering the blocking threads' priority (a nice increment, Linux `setpriority` on
//! the thread) makes the scheduler run the async threads first; the blocking threads still get
//! every cycle the async threads leave, and all tenants' guest code shares the same priority.
//! `make soak` measures the effect on a second tenant's latency.

#![allow(unsafe_code)]

/// How much lower the blocking threads' priority is (a nice increment; the result is capped
/// at 19, the lowest).
pub(crate) const BLOCKING_NICENESS: i32 = 10;

/// Lowers the calling thread's CPU priority by [`BLOCKING_NICENESS`], once per thread. Best
/// effort: a failure (or another OS) leaves the priority as it was.
pub(crate) fn lower_blocking_priority() {
    thread_local! {
        static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if LOWERED.with(|lowered| lowered.replace(true)) {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Some(now) = thread_niceness() {
        let tid = current_tid();
        // SAFETY: a plain system call on the calling thread's id, with no pointers.
        unsafe {
            libc::setpriority(
                libc::PRIO_PROCESS,
                tid,
                now.saturating_add(BLOCKING_NICENESS).min(19),
            );
        }
    }
}

#[cfg(target_os = "linux")]
fn current_tid() -> libc::id_t {
    // SAFETY: `gettid` takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    tid as libc::id_t
}

/// The calling thread's nice value, if it can be read.
#[cfg(target_os = "linux")]
fn thread_niceness() -> Option<i32> {
    let tid = current_tid();
    // SAFETY: as above; -1 is also a valid nice value, so errno tells errors apart.
    unsafe {
        *libc::__errno_location() = 0;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        (*libc::__errno_location() == 0).then_some(now)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_blocking_thread_runs_below_the_others_once() {
        let (before, after, again) = std::thread::spawn(|| {
            let before = thread_niceness().unwrap();
            lower_blocking_priority();
            let after = thread_niceness().unwrap();
            lower_blocking_priority();
            (before, after, thread_niceness().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(after, (before + BLOCKING_NICENESS).min(19));
        assert_eq!(again, after, "lowered once per thread");
        // Other threads keep theirs.
        assert_eq!(thread_niceness().unwrap(), before);
    }
}
