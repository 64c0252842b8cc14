//! Following the change log: how a replica learns that another one deployed, changed or
//! deleted a function, stored or deleted a model, or changed a tenant.
//!
//! A follower holds its own connection with `LISTEN tw_changes`. Every write of a function
//! record appends a row to `tw_changes` and sends `NOTIFY tw_changes` in its transaction, so
//! a commit wakes every follower at once. Notifications are not durable (a follower that is
//! reconnecting misses them), so the follower never trusts them for content: woken, or every
//! `poll` interval anyway, it reads the rows after the last sequence number it handled, in
//! order, and hands each to its callback. After a lost connection it reconnects with backoff
//! and catches up from the same sequence number. Writers of the log take turns
//! (`log_change`), so sequence numbers become visible in order and none is skipped.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use crate::error::SharedStoreError;
use crate::store::{Shared, SharedStore};

/// One row of the change log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Position in the log; strictly increasing.
    pub seq: i64,
    /// What changed: `function` for a function record, `model` for a model record
    /// ([`Change::model`]), `tenant`, `admin`.
    pub kind: String,
    /// Which one: the function id, `<tenant>/<name>` of a model, the tenant id.
    pub key: String,
}

/// How a follower waits and retries.
#[derive(Debug, Clone, Copy)]
pub struct FollowOptions {
    /// The longest it waits without a notification before reading the log anyway.
    pub poll: Duration,
    /// The longest wait between reconnection attempts (backoff doubles from 100 ms).
    pub max_backoff: Duration,
}

impl Default for FollowOptions {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// A running follower; dropping it stops it.
pub struct ChangeFollower {
    task: JoinHandle<()>,
    handled: Arc<std::sync::atomic::AtomicI64>,
    connected: Arc<std::sync::atomic::AtomicBool>,
    heard: Freshness,
}

/// When a follower last read the change log to its end: whether what it applied is current.
#[derive(Clone, Debug)]
pub struct Freshness {
    /// Milliseconds since `since` at the last complete read; `u64::MAX`: never.
    heard_ms: Arc<std::sync::atomic::AtomicU64>,
    since: std::time::Instant,
}

impl Freshness {
    fn new() -> Self {
        Freshness {
            heard_ms: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
            since: std::time::Instant::now(),
        }
    }

    /// The log was read to its end now.
    fn heard(&self) {
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.heard_ms
            .store(now, std::sync::atomic::Ordering::Release);
    }

    /// Whether the log was read to its end within the last `bound`.
    #[must_use]
    pub fn within(&self, bound: Duration) -> bool {
        let heard = self.heard_ms.load(std::sync::atomic::Ordering::Acquire);
        if heard == u64::MAX {
            return false;
        }
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(heard) <= u64::try_from(bound.as_millis()).unwrap_or(u64::MAX)
    }
}

impl std::fmt::Debug for ChangeFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeFollower")
            .field("handled", &self.handled())
            .finish()
    }
}

impl ChangeFollower {
    /// Whether the follower's connection to PostgreSQL is up (it listens and has caught up
    /// once since connecting): false while the database cannot be reached.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A shareable form of [`ChangeFollower::is_connected`] (for a readiness check).
    #[must_use]
    pub fn connection_state(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.connected.clone()
    }

    /// When the follower last read the log to its end (shareable: for a policy source that
    /// fails closed when it is behind, and a readiness check).
    #[must_use]
    pub fn freshness(&self) -> Freshness {
        self.heard.clone()
    }

    /// The sequence number of the last change handed to the callback.
    #[must_use]
    pub fn handled(&self) -> i64 {
        self.handled.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for ChangeFollower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The callback of a follower: called for each change in order, on a blocking thread. An
/// error (the change could not be applied, e.g. the store could not be read) makes the
/// follower retry that change after a backoff instead of going past it.
pub type OnChange = Arc<dyn Fn(&Change) -> Result<(), String> + Send + Sync>;

impl SharedStore {
    /// The sequence number of the newest change in the log (0 when it is empty). Read it
    /// before loading the records a follower will keep up to date, and start the follower
    /// from it: nothing committed in between is missed.
    ///
    /// # Errors
    /// The runtime's storage error when PostgreSQL cannot be read.
    pub fn latest_change(&self) -> tensor_wasm_runtime::Result<i64> {
        self.with_db("tw_changes", |db| async move {
            let client = db.client().await?;
            let row = client
                .query_one("SELECT COALESCE(MAX(seq), 0) FROM tw_changes", &[])
                .await?;
            Ok(row.get::<_, i64>(0))
        })
    }

    /// Starts following the change log after sequence number `after`, calling `on_change` for
    /// each change in order (see the module documentation).
    pub fn follow_changes(
        &self,
        after: i64,
        options: FollowOptions,
        on_change: OnChange,
    ) -> ChangeFollower {
        let handled = Arc::new(std::sync::atomic::AtomicI64::new(after));
        let connected = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let heard = Freshness::new();
        let session = Session {
            db: self.db.clone(),
            metrics: self.metrics.clone(),
            options,
            on_change,
            handled: handled.clone(),
            connected: connected.clone(),
            heard: heard.clone(),
        };
        let task = self.bridge.spawn(follow(session));
        ChangeFollower {
            task,
            handled,
            connected,
            heard,
        }
    }
}

/// What one follower carries from connection to connection.
struct Session {
    db: Arc<crate::pool::Db>,
    metrics: Option<crate::metrics::SharedMetrics>,
    options: FollowOptions,
    on_change: OnChange,
    handled: Arc<std::sync::atomic::AtomicI64>,
    connected: Arc<std::sync::atomic::AtomicBool>,
    heard: Freshness,
}

async fn follow(session: Session) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let error = match listen(&session).await {
            Ok(never) => match never {},
            Err(e) => e,
        };
        session
            .connected
            .store(false, std::sync::atomic::Ordering::Release);
        tracing::warn!(
            error = %error,
            retry_in_ms = backoff.as_millis() as u64,
            "change-log follower stopped; retrying"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(session.options.max_backoff);
    }
}

/// One connection's worth of following; returns why it ended.
async fn listen(session: &Session) -> Shared<std::convert::Infallible> {
    let (client, mut connection) = session.db.open(true).await?;
    let wake = Arc::new(Notify::new());
    let waker = wake.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(_))) => waker.notify_one(),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    // Wake the reader so that it finds the connection closed.
                    waker.notify_one();
                    return;
                }
            }
        }
    });
    let _driver = AbortOnDrop(driver);
    session
        .db
        .bounded(async { Ok(client.batch_execute("LISTEN tw_changes").await?) })
        .await?;
    loop {
        let after = session.handled.load(std::sync::atomic::Ordering::Acquire);
        // Bounded: a server that stops answering ends this connection, and the follower
        // connects again, instead of waiting for it for ever.
        let rows = session
            .db
            .bounded(async {
                Ok(client
                    .query(
                        "SELECT seq, kind, key, EXTRACT(EPOCH FROM clock_timestamp() - at)::FLOAT8
                         FROM tw_changes WHERE seq > $1 ORDER BY seq",
                        &[&after],
                    )
                    .await?)
            })
            .await?;
        let changes: Vec<(Change, f64)> = rows
            .iter()
            .map(|row| {
                let change = Change {
                    seq: row.get(0),
                    kind: row.get(1),
                    key: row.get(2),
                };
                (change, row.get(3))
            })
            .collect();
        let fetched = std::time::Instant::now();
        for (i, (change, age)) in changes.iter().enumerate() {
            let (seq, kind) = (change.seq, change.kind.clone());
            // A change of a record that changes again later in this batch is covered by that
            // later one: the callback reads the record as it is now, after both. Under a burst
            // of changes to one record (a busy tenant), the follower reads it once.
            let again = changes[i + 1..]
                .iter()
                .any(|(later, _)| later.kind == change.kind && later.key == change.key);
            if !again {
                let callback = session.on_change.clone();
                let change = change.clone();
                tokio::task::spawn_blocking(move || callback(&change))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|applied| applied)
                    .map_err(|e| {
                        SharedStoreError::Io(std::io::Error::other(format!(
                            "change {seq} not applied: {e}"
                        )))
                    })?;
            }
            session
                .handled
                .store(seq, std::sync::atomic::Ordering::Release);
            if let Some(metrics) = &session.metrics {
                metrics.observe_lag(&kind, age + fetched.elapsed().as_secs_f64());
            }
        }
        session
            .connected
            .store(true, std::sync::atomic::Ordering::Release);
        session.heard.heard();
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(session.options.poll) => {}
        }
        if client.is_closed() {
            // The next query would fail the same way; say why.
            return Err(SharedStoreError::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the listening connection closed",
            )));
        }
    }
}

/// Aborts a task when dropped (the follower's connection driver ends with its reader).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
