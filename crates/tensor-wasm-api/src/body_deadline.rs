//! The request-body deadline: every request body gets a time limit
//! (`ApiConfig::body_read_timeout`, counted from the request's arrival);
//! [`crate::edge`] answers `408 request_timeout` when the handler was still
//! reading it at the deadline.
//!
//! Nothing is buffered here: the body is wrapped and read by the handler as
//! before (after authentication and the rate check). The timer is armed only
//! when a read has to wait: a body that is there with its headers, as small
//! bodies on a fast connection are, never touches the timer wheel.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

/// A body that fails once its deadline passes.
pub(crate) struct DeadlineBody {
    inner: Body,
    deadline: Instant,
    /// Armed at the first read that has to wait.
    timer: Option<Pin<Box<Sleep>>>,
    expired: Arc<AtomicBool>,
}

impl DeadlineBody {
    /// `inner`, failing at `deadline` and setting `expired` then.
    pub(crate) fn new(inner: Body, deadline: Instant, expired: Arc<AtomicBool>) -> Self {
        DeadlineBody {
            inner,
            deadline,
            timer: None,
            expired,
        }
    }

    fn fail(&self) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.expired.store(true, Ordering::Release);
        Poll::Ready(Some(Err(axum::Error::new(BodyReadTimeout))))
    }
}

/// The error a [`DeadlineBody`] ends with.
#[derive(Debug)]
struct BodyReadTimeout;

impl std::fmt::Display for BodyReadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive within the body-read timeout")
    }
}

impl std::error::Error for BodyReadTimeout {}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(timer) = self.timer.as_mut() {
            if timer.as_mut().poll(cx).is_ready() {
                return self.fail();
            }
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_pending() && self.timer.is_none() {
            // The first wait: from now on the deadline is a timer, polled
            // here so that it wakes this task.
            let mut timer = Box::pin(tokio::time::sleep_until(self.deadline.into()));
            let fired = timer.as_mut().poll(cx).is_ready();
            self.timer = Some(timer);
            if fired {
                return self.fail();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    // Kept, so that a declared length over the limit is refused (413)
    // before anything is read.
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
