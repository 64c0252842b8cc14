//! A minimal executor that runs one future on the calling thread by parking it.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread, parking between polls.
/// Works inside and outside a tokio runtime's blocking threads; never call it
/// from an async task (it would block that worker).
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    // Most futures here are ready at once (an uncontended permit, a finished kernel): one
    // poll with a waker that does nothing answers them without allocating a thread waker.
    if let Poll::Ready(out) = future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        return out;
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// Polls `future` on this thread, parking between polls, until it is ready or `deadline` has
/// passed: `Some(output)`, or `None` at the deadline (the future is left as it is: poll it
/// again, or drop it to give up). Never call it from an async task.
pub fn block_on_until<F: Future + Unpin>(future: &mut F, deadline: Instant) -> Option<F::Output> {
    if let Poll::Ready(out) =
        std::pin::Pin::new(&mut *future).poll(&mut Context::from_waker(Waker::noop()))
    {
        return Some(out);
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = std::pin::Pin::new(&mut *future).poll(&mut cx) {
            return Some(out);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::park_timeout(deadline - now);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn block_on_until_gives_up_at_the_deadline_and_keeps_the_future() {
        let mut never = std::future::pending::<()>();
        let start = Instant::now();
        assert_eq!(
            block_on_until(&mut never, start + Duration::from_millis(30)),
            None
        );
        assert!(start.elapsed() >= Duration::from_millis(30));
        let mut ready = std::future::ready(7);
        assert_eq!(
            block_on_until(&mut ready, start),
            Some(7),
            "ready is never late"
        );
    }
}
