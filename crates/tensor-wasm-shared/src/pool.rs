//! The replica's PostgreSQL connections: a bounded pool, and every wait on the database bounded.
//!
//! - At most [`PoolOptions::max_connections`] connections are open for calls; a call waits for
//!   a free one at most [`PoolOptions::statement_timeout`].
//! - Connecting (TCP, TLS and PostgreSQL's startup) ends after [`PoolOptions::connect_timeout`].
//! - Every session carries `statement_timeout` (PostgreSQL cancels a statement that runs
//!   longer, advisory-lock waits included) and `idle_in_transaction_session_timeout`; and each
//!   database call is bounded on this side too ([`Db::bounded`]), so that a server that stops
//!   answering (a frozen process, a half-open connection) ends the call with a timeout instead
//!   of hanging the replica. A connection that was held that long is closed, not reused.
//! - A connection idle for [`PoolOptions::idle_timeout`] is closed.
//!
//! No connection is held across an object-storage call: a call that stores a blob and writes
//! a row uses short transactions on either side of the upload (`store.rs`, `put_module`). The
//! orphan collector (`orphans.rs`), an operator's command, is the one exception: it deletes a
//! module's blob inside the transaction that holds the module's lock.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::Client;

use crate::error::SharedStoreError;
use crate::store::Shared;

/// Bounds of a replica's database connections (`serve --db-*` flags, docs/deploy.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Connections open at once for calls (the change-log follower and the bootstrap lock
    /// have one each besides).
    pub max_connections: usize,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long one statement may run, and one database call (a transaction) may take on this
    /// side, waiting for a free connection included.
    pub statement_timeout: Duration,
    /// How long an unused connection stays open.
    pub idle_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_connections: 8,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// How much longer than `statement_timeout` a call may take on this side: the server's own
/// cancellation, with its clear error, comes first when the server answers at all.
const CLIENT_MARGIN: Duration = Duration::from_secs(1);

/// An unused connection and since when.
struct Idle {
    client: Client,
    since: Instant,
}

/// The pool of one store (see the module documentation).
pub(crate) struct Db {
    pub(crate) url: String,
    pub(crate) options: PoolOptions,
    idle: std::sync::Mutex<Vec<Idle>>,
    permits: Arc<Semaphore>,
}

impl Db {
    pub(crate) fn new(url: &str, options: PoolOptions) -> Self {
        Self {
            url: url.to_owned(),
            options,
            idle: std::sync::Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(options.max_connections.max(1))),
        }
    }

    /// A connection for one call: an idle one, or a new one while fewer than
    /// `max_connections` are out.
    pub(crate) async fn client(&self) -> Shared<Conn<'_>> {
        let wait = self.options.statement_timeout;
        let permit = tokio::time::timeout(wait, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                SharedStoreError::Timeout(format!(
                    "no free database connection within {} ms (all {} in use)",
                    wait.as_millis(),
                    self.options.max_connections
                ))
            })?
            .expect("the pool's semaphore is never closed");
        let reused = self.take_idle();
        let client = match reused {
            Some(client) => client,
            None => self.connect(true).await?,
        };
        Ok(Conn {
            db: self,
            client: Some(client),
            since: Instant::now(),
            _permit: permit,
        })
    }

    /// The newest usable idle connection; closes those that closed or idled too long.
    fn take_idle(&self) -> Option<Client> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let limit = self.options.idle_timeout;
        idle.retain(|c| !c.client.is_closed() && c.since.elapsed() < limit);
        idle.pop().map(|c| c.client)
    }

    /// A new connection of this store's settings, driven on the current runtime; without
    /// `statement_timeout` its statements may wait as long as they need (a session-level lock
    /// held for a whole bootstrap).
    pub(crate) async fn connect(&self, statement_timeout: bool) -> Shared<Client> {
        let (client, connection) = self.open(statement_timeout).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.run().await {
                tracing::warn!(error = %e, "shared store: PostgreSQL connection lost");
            }
        });
        Ok(client)
    }

    /// A new connection of this store's settings (see [`Db::connect`]); the caller drives it.
    pub(crate) async fn open(
        &self,
        statement_timeout: bool,
    ) -> Shared<(Client, crate::tls::Connection)> {
        let options = self.options;
        let connecting = crate::tls::connect(&self.url, |config| {
            let mut settings = config.get_options().unwrap_or_default().to_owned();
            let statement_ms = if statement_timeout {
                options.statement_timeout.as_millis()
            } else {
                0
            };
            settings.push_str(&format!(
                " -c statement_timeout={statement_ms} \
                 -c idle_in_transaction_session_timeout={}",
                (options.statement_timeout * 2).as_millis()
            ));
            config
                .options(settings.trim())
                .connect_timeout(options.connect_timeout)
                .keepalives(true)
                .keepalives_idle(Duration::from_secs(30))
                .tcp_user_timeout(options.statement_timeout + CLIENT_MARGIN);
        });
        tokio::time::timeout(options.connect_timeout, connecting)
            .await
            .map_err(|_| {
                SharedStoreError::Timeout(format!(
                    "connecting to PostgreSQL took longer than {} ms",
                    options.connect_timeout.as_millis()
                ))
            })?
    }

    /// `call` (one database call: a transaction and its statements), ended with
    /// [`SharedStoreError::Timeout`] when it takes longer than the statement timeout and a
    /// margin.
    pub(crate) async fn bounded<T>(&self, call: impl Future<Output = Shared<T>>) -> Shared<T> {
        let limit = self.options.statement_timeout + CLIENT_MARGIN;
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(SharedStoreError::Timeout(format!(
                "the database did not answer within {} ms",
                limit.as_millis()
            )))
        })
    }

    /// How many connections are open for calls: (in use, idle).
    pub(crate) fn counts(&self) -> (usize, usize) {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).len();
        let in_use = self.options.max_connections.max(1) - self.permits.available_permits();
        (in_use, idle)
    }
}

/// A connection of the pool, held for one call; back to the pool when dropped, unless it
/// closed or was held as long as a timeout (a call that may have been cut off mid-statement).
pub(crate) struct Conn<'a> {
    db: &'a Db,
    client: Option<Client>,
    since: Instant,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if client.is_closed() || self.since.elapsed() >= self.db.options.statement_timeout {
            return;
        }
        let mut idle = self.db.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.push(Idle {
            client,
            since: Instant::now(),
        });
    }
}

impl std::ops::Deref for Conn<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("a connection until dropped")
    }
}

impl std::ops::DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().expect("a connection until dropped")
    }
}
