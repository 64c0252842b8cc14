//! Graceful shutdown hooks: the server binary stops accepting connections,
//! gives in-flight work until a deadline, then calls [`AppState::end_streams`]
//! so open streams end with a final event (axum would otherwise wait for
//! them forever), and records the jobs still unfinished as failed.

use std::future::Future;

use tokio::sync::watch;

use crate::{AppState, ErrorCode};

/// The signal open streams wait on.
#[derive(Debug)]
pub(crate) struct StreamsEnd(watch::Sender<bool>);

impl StreamsEnd {
    pub(crate) fn new() -> Self {
        StreamsEnd(watch::Sender::new(false))
    }
}

impl AppState {
    /// Ends every open `invoke-stream` response, now and from now on: SSE
    /// streams get a final `event: error` with code `shutting_down`, chunked
    /// bodies are aborted, and each guest is stopped at its next write (as
    /// if its client had left). For graceful shutdown, once in-flight work
    /// has had its time.
    pub fn end_streams(&self) {
        self.inner.streams_end.0.send_replace(true);
    }

    /// Resolves once [`AppState::end_streams`] has been called.
    pub(crate) fn streams_end(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.streams_end.0.subscribe();
        async move {
            if rx.wait_for(|ended| *ended).await.is_err() {
                // The state is gone without a shutdown: never end early.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Asynchronous jobs queued or running (with the shared job queue: those this replica
    /// runs now).
    pub fn unfinished_jobs(&self) -> usize {
        match self.inner.queue.get() {
            Some(shared) => shared.running_here(),
            None => self.inner.jobs.unfinished(),
        }
    }

    /// Records every queued or running job as failed with code
    /// `shutting_down` ("failed: server shutting down"), durably; a guest
    /// still running is abandoned and its outcome discarded. Returns how many.
    ///
    /// With the shared job queue, stops claiming jobs instead and puts those this replica
    /// still runs back in the queue, for another replica to run (blocking on the store).
    pub fn fail_unfinished_jobs(&self) -> usize {
        if let Some(shared) = self.inner.queue.get() {
            return shared.stop();
        }
        self.inner.jobs.fail_unfinished(
            ErrorCode::ShuttingDown,
            "failed: server shutting down before the job finished",
        )
    }
}
