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
    runtime: Runtime,
}

impl Bridge {
    pub(crate) fn new() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tw-shared-store")
            .enable_all()
            .build()?;
        Ok(Self { runtime })
    }

    /// Runs `future` on the store's runtime and blocks this thread until it finishes. Any
    /// thread may call it, except one of the store's own runtime.
    pub(crate) fn run<T, F>(&self, future: F) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (done, result) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let _ = done.send(future.await);
        });
        result
            .recv()
            .expect("the shared store's runtime ended while a call was in flight")
    }
}
