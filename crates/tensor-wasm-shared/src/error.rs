//! Errors of the shared store, and how they reach the runtime.

use std::path::PathBuf;

use tensor_wasm_runtime::RuntimeError;
use tokio_postgres::error::SqlState;

/// Why a call to the shared store failed.
#[derive(Debug, thiserror::Error)]
pub enum SharedStoreError {
    /// A URL or option is not usable.
    #[error("shared store configuration: {0}")]
    Config(String),
    /// PostgreSQL refused or failed a statement, or cannot be reached.
    #[error("PostgreSQL: {}", with_causes(.0))]
    Database(#[from] tokio_postgres::Error),
    /// The object store failed or cannot be reached.
    #[error("object store: {0}")]
    Object(#[from] object_store::Error),
    /// The database was migrated by a newer build.
    #[error(
        "the database schema is at version {database}, newer than this build knows ({known}); \
         run a build at least as new"
    )]
    SchemaTooNew { database: i32, known: i32 },
    /// Stored data does not match what its record says.
    #[error("corrupt shared data: {0}")]
    Corrupt(String),
    /// The database did not answer in time (a connection, a free connection of the pool, a
    /// call: `pool.rs`).
    #[error("PostgreSQL: {0}")]
    Timeout(String),
    /// The store's own runtime could not start.
    #[error("shared store runtime: {0}")]
    Io(#[from] std::io::Error),
}

/// `error` and each error that caused it, joined by ": " (a TLS handshake's reason, say, is
/// only in the chain).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}

impl SharedStoreError {
    /// Whether the store could not be reached (connection refused, lost or timed out), as
    /// opposed to a store that answered with an error: a retry may succeed.
    pub fn is_unavailable(&self) -> bool {
        match self {
            // A statement the server refused carries an SQLSTATE; a connection failure not.
            // Unavailability too: the server shutting down or starting up, or ending a
            // statement for its timeout (class 57, operator intervention), a connection
            // exception (class 08), too many connections (class 53), a transaction ended for
            // idling.
            SharedStoreError::Database(e) => match e.code() {
                None => true,
                Some(code) => {
                    e.is_closed()
                        || ["57", "08", "53"].contains(&&code.code()[..2])
                        || *code == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
                }
            },
            SharedStoreError::Timeout(_) => true,
            // HTTP-level failures (connection, timeouts, 5xx after retries) are `Generic`.
            SharedStoreError::Object(e) => matches!(e, object_store::Error::Generic { .. }),
            _ => false,
        }
    }

    /// The runtime's error for this failure, naming `what` (a table or an object key):
    /// [`RuntimeError::StoreUnavailable`] when the store could not be reached, a storage
    /// error otherwise.
    pub(crate) fn into_runtime(self, what: &str) -> RuntimeError {
        if self.is_unavailable() {
            return RuntimeError::StoreUnavailable(format!("{what}: {self}"));
        }
        RuntimeError::Storage {
            path: PathBuf::from(what),
            source: std::io::Error::other(self.to_string()),
        }
    }
}
