//! The store's own async runtime, and the bridge from the runtime's blocking threads into it.
//!
//! [`tensor_wasm_runtime::FunctionStore`] is a blocking trait, called on the server's blocking
//! threads; the PostgreSQL and object-store clients are async. Blocking on a second Tokio
//! runtime from a thread of the server's runtime (its blocking pool included) panics in current
//! Tokio, so each call is spawned onto this store's runtime and its result comes back over a
//! standard channel, which blocks any thread safely.

use std::future::Future;

use tokio::runtime::Runtime;

/// A small multi-threaded Tokio runtime owned by one store.
pub(crate) struct Bridge {
    /// `None` only while dropping.
    runtime: Option<Runtime>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // The last owner of a store can be a task of this very runtime (a follower's callback
        // holds the runtime that holds the store); waiting for the workers there would panic,
        // so the runtime is shut down without waiting for them.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Bridge {
    pub(crate) fn new() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tw-shared-store")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    fn runtime(&self) -> &Runtime {
        self.runtime
            .as_ref()
            .expect("the runtime lives until the bridge drops")
    }

    /// Spawns a background task on the store's runtime.
    pub(crate) fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime().spawn(future)
    }

    /// Runs `future` on the store's runtime and blocks this thread until it finishes. Any
    /// thread may call it, except one of the store's own runtime.
    pub(crate) fn run<T, F>(&self, future: F) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (done, result) = std::sync::mpsc::sync_channel(1);
        self.runtime().spawn(async move {
            let _ = done.send(future.await);
        });
        result
            .recv()
            .expect("the shared store's runtime ended while a call was in flight")
    }
}
