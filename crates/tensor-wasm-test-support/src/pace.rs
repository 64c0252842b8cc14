//! Deliberate slowness that is not synchronisation: load tools and slow
//! clients that hold back on purpose, named so a reader sees why they wait.
//!
//! Nothing here waits *for* a state (that is [`crate::wait`]); these calls
//! model an actor that is slow by design, and the test's assertions do not
//! depend on how long they take.

use std::time::Duration;

/// A client that reads slowly on purpose pauses between reads (a slow
/// consumer exercising back-pressure).
pub fn slow_client_pause(interval: Duration) {
    std::thread::sleep(interval);
}

/// A load generator that was refused (429) backs off before trying again,
/// as a well-behaved client honouring `Retry-After` would.
pub async fn load_tool_back_off(interval: Duration) {
    tokio::time::sleep(interval).await;
}

/// A client that sends its request slowly on purpose pauses between
/// writes (a slow-trickle client exercising a server's read timeouts).
pub async fn slow_client_trickle(interval: Duration) {
    tokio::time::sleep(interval).await;
}

/// A replica's periodic task (a lease renewal, say) waits out its period before the next run.
pub fn periodic_task_period(period: Duration) {
    std::thread::sleep(period);
}

/// A scripted fault schedule (kill a replica at 1/3 of a run, restart the database at 2/3)
/// waits for its next step's time; the clients' load runs on meanwhile.
pub fn fault_schedule_step(until: Duration) {
    std::thread::sleep(until);
}
