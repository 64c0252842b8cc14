//! Connections and request bodies on a real loopback socket: the body is read only after authentication and the rate check,
//! slow headers and slow bodies run into their timeouts, and connections
//! above the cap are answered `503 too_many_connections` while the others
//! keep working.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::{json, Value};
use tensor_wasm_api::{serve, ApiConfig, ServeLimits};
use tensor_wasm_test_support::app::{EnforcedApp, Reply};
use tensor_wasm_test_support::pace::slow_client_trickle;
use tensor_wasm_test_support::wait::wait_for_async;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long any single answer may take before the test calls it missing.
const ANSWER_BOUND: Duration = Duration::from_secs(20);

/// `app`'s router behind [`serve`] on a loopback port.
async fn start(app: &EnforcedApp, limits: ServeLimits) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = app.app.clone();
    tokio::spawn(serve(listener, router, limits, std::future::pending()));
    addr
}

/// One response read off `stream`: status, head and body (by
/// `Content-Length`); `None` when the server closed the connection first.
async fn read_response(stream: &mut TcpStream) -> Option<(u16, String, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        match tokio::time::timeout(ANSWER_BOUND, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => raw.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("no answer within {ANSWER_BOUND:?}"),
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = raw[head_end..].to_vec();
    while body.len() < length {
        let n = tokio::time::timeout(ANSWER_BOUND, stream.read(&mut chunk))
            .await
            .expect("the body arrives")
            .unwrap();
        assert!(n > 0, "the body was cut short");
        body.extend_from_slice(&chunk[..n]);
    }
    Some((status, head, body))
}

fn code(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["error"]["code"].as_str().unwrap_or("<none>").to_owned()
}

/// The head of an upload that announces 64 MiB.
fn big_upload(token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST /functions HTTP/1.1\r\nHost: test\r\n{auth}Content-Type: application/wasm\r\n\
         Content-Length: {}\r\n\r\n",
        64 << 20
    )
}

/// An unauthenticated 64 MiB upload, and an authenticated one refused by a
/// quota (here `max_functions` 0), are answered (401, 409) after the first
/// 64 KiB: the server decides before it reads the body, while the client
/// has not finished sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_refused_before_their_body_is_read() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("uploader", json!({"max_functions": 0})).await;
    let addr = start(&s, ServeLimits::default()).await;
    let first_part = vec![0u8; 64 << 10];
    for (token, expected) in [
        (None, (401, "unauthorized")),
        (Some(&t), (409, "quota_count_exceeded")),
    ] {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(big_upload(token.map(String::as_str)).as_bytes())
            .await
            .unwrap();
        stream.write_all(&first_part).await.unwrap();
        let (status, head, body) = read_response(&mut stream).await.expect("an answer");
        assert_eq!((status, code(&body).as_str()), expected, "{head}");
    }
}

/// A body that records whether anyone read it.
struct Watched(Arc<AtomicBool>);

impl futures_core::Stream for Watched {
    type Item = Result<Vec<u8>, std::io::Error>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.store(true, Ordering::SeqCst);
        std::task::Poll::Ready(None)
    }
}

/// A tenant over its request rate gets 429 before its body is read.
#[tokio::test]
async fn the_rate_check_comes_before_the_body() {
    let s = EnforcedApp::new();
    let (_, t) = s
        .tenant("hasty", json!({"requests_per_second": 1, "burst": 1}))
        .await;
    // Use the bucket up (a burst of 1: the second request is over the rate).
    let drained = async {
        for _ in 0..100 {
            let r = s.as_token(&t, Method::GET, "/functions", Value::Null).await;
            if r.status == StatusCode::TOO_MANY_REQUESTS {
                return true;
            }
        }
        false
    };
    assert!(drained.await, "the rate quota never refused a request");
    let read = Arc::new(AtomicBool::new(false));
    let request = Request::builder()
        .method(Method::POST)
        .uri("/functions")
        .header(header::AUTHORIZATION, format!("Bearer {t}"))
        .header(header::CONTENT_TYPE, "application/wasm")
        .body(Body::from_stream(Watched(read.clone())))
        .unwrap();
    let r = Reply::of(&s.app, request).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
    );
    assert!(
        !read.load(Ordering::SeqCst),
        "the body was read before the rate check"
    );
}

/// A client that trickles its headers one line every 50 ms is cut off at
/// the header-read timeout (300 ms here), whatever it keeps sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_is_closed_at_the_header_timeout() {
    let s = EnforcedApp::new();
    let limits = ServeLimits {
        header_read_timeout: Duration::from_millis(300),
        ..ServeLimits::default()
    };
    let addr = start(&s, limits).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 256];
    let closed = loop {
        assert!(
            started.elapsed() < ANSWER_BOUND,
            "the connection is still open after {ANSWER_BOUND:?} of trickled headers"
        );
        if stream.write_all(b"X-Slow: 1\r\n").await.is_err() {
            break true;
        }
        slow_client_trickle(Duration::from_millis(50)).await;
        match tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(_)) => break false,
            Err(_) => {}
        }
    };
    assert!(
        closed,
        "the server answered a request whose headers never ended"
    );
    // The server itself still serves.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut stream).await.expect("an answer").0, 200);
}

/// A body that stops half-way is answered `408 request_timeout` at the
/// body-read timeout, and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_gets_408() {
    let api = ApiConfig {
        body_read_timeout: Duration::from_millis(300),
        ..ApiConfig::default()
    };
    let s = EnforcedApp::with(|_| {}, api);
    let (_, t) = s.tenant("slow", json!({})).await;
    let f = s.deploy_id(&t, "calc.wat", "name=calc").await;
    let addr = start(&s, ServeLimits::default()).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /functions/{f}/invoke HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {t}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"export\": "
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (status, head, body) = read_response(&mut stream).await.expect("an answer");
    assert_eq!(
        (status, code(&body).as_str()),
        (408, "request_timeout"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
}

/// With a cap of 2 connections, a third is answered `503
/// too_many_connections` and closed, the two keep working, and a connection
/// made after one of them closes is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_above_the_cap_get_503_and_the_others_keep_working() {
    let s = EnforcedApp::new();
    let limits = ServeLimits {
        max_connections: 2,
        ..ServeLimits::default()
    };
    let addr = start(&s, limits).await;
    const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n";
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(HEALTH).await.unwrap();
        assert_eq!(read_response(&mut stream).await.expect("an answer").0, 200);
        open.push(stream);
    }
    let mut extra = TcpStream::connect(addr).await.unwrap();
    extra.write_all(HEALTH).await.unwrap();
    let (status, head, body) = read_response(&mut extra).await.expect("an answer");
    assert_eq!(
        (status, code(&body).as_str()),
        (503, "too_many_connections"),
        "{head}"
    );
    assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(ANSWER_BOUND, extra.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the refused connection is closed"
    );
    for stream in &mut open {
        stream.write_all(HEALTH).await.unwrap();
        assert_eq!(read_response(stream).await.expect("an answer").0, 200);
    }
    drop(open.pop());
    wait_for_async(ANSWER_BOUND, "a connection is served again", || async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(HEALTH).await.ok()?;
        let (status, _, _) = read_response(&mut stream).await?;
        (status == 200).then_some(())
    })
    .await;
}
