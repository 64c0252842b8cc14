//! The connection loop in front of the router: [`serve`] accepts TCP
//! connections up to a cap, gives each a header-read deadline, and shuts
//! down gracefully. Used by `tensor-wasm serve` instead of `axum::serve`,
//! which has neither a connection cap nor a header timeout.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::{ApiError, ErrorCode};

/// Connections above the cap that are still answered (`503
/// too_many_connections`) rather than closed unanswered.
const REFUSED_ANSWERED: usize = 64;

/// How long after an accept error the loop tries again (the error is
/// usually the process's descriptor limit, which only time frees).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Limits of the connection loop (`serve` flags).
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// How long a connection may take to send a request's headers, counted
    /// from the connection (or from the end of the previous response on a
    /// kept-alive one); then it is closed without an answer.
    pub header_read_timeout: Duration,
    /// Connections served at once. Above it, up to 64 more are answered
    /// `503 too_many_connections` (with `Connection: close`) and closed;
    /// beyond those, connections are closed at once.
    pub max_connections: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// Serves `app` ([`crate::App`], or a bare [`crate::router`]) on `listener`
/// within `limits` until `shutdown` resolves;
/// then stops accepting, lets every open connection finish its request in
/// flight (kept-alive connections close after it) and returns when all
/// are closed.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    S: tower::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let served = Arc::new(Semaphore::new(limits.max_connections));
    let refused = Arc::new(Semaphore::new(REFUSED_ANSWERED));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        // Reap the connections that ended, so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if let Ok(permit) = Arc::clone(&served).try_acquire_owned() {
            let app = app.clone();
            let stopping = stopping.clone();
            connections.spawn(serve_connection(stream, app, limits, stopping, permit));
        } else if let Ok(permit) = Arc::clone(&refused).try_acquire_owned() {
            tracing::warn!(
                max_connections = limits.max_connections,
                "connection cap reached: answering 503"
            );
            connections.spawn(refuse_connection(stream, limits, permit));
        } else {
            tracing::warn!(
                max_connections = limits.max_connections,
                "connection cap reached: closing unanswered"
            );
        }
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// HTTP/1 with the header-read deadline on hyper's timer: armed whenever the
/// connection waits for a request head, so it covers a connection that sends
/// nothing and an idle kept-alive one too.
fn http1_builder(limits: ServeLimits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
}

async fn serve_connection<S>(
    stream: TcpStream,
    app: S,
    limits: ServeLimits,
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) where
    S: tower::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let connection = http1_builder(limits).serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => log_end(result),
        // The guard `wait_for` returns is dropped inside the block, before the await below.
        () = async { drop(stopping.wait_for(|stop| *stop).await) } => {
            connection.as_mut().graceful_shutdown();
            log_end(connection.await);
        }
    }
}

/// Answers every request on a connection above the cap with `503
/// too_many_connections`, then closes it.
async fn refuse_connection(stream: TcpStream, limits: ServeLimits, _permit: OwnedSemaphorePermit) {
    let service = hyper::service::service_fn(|_: Request<Incoming>| async {
        Ok::<_, Infallible>(too_many_connections())
    });
    let mut builder = http1_builder(limits);
    builder.keep_alive(false);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    // Bounded: a client that never sends a whole request is dropped.
    let _ = tokio::time::timeout(limits.header_read_timeout * 2, connection).await;
}

fn too_many_connections() -> Response {
    let mut response = ApiError::new(
        ErrorCode::TooManyConnections,
        "the server serves as many connections as it may; retry shortly",
    )
    .into_response();
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn log_end(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        // Timeouts, resets and malformed requests end here: the client's doing.
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
