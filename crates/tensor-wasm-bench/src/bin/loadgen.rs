//! HTTP load generator: N keep-alive HTTP/1.1 connections POST one body to one
//! URL for D seconds (at most 60), then one JSON line on stdout with
//! `requests` (2xx responses), `errors` (non-2xx responses and connection
//! failures), `seconds`, `req_per_s` (2xx per second) and the latency
//! percentiles `p50_us` / `p99_us` of completed responses.
//!
//! Closed loop: each connection sends its next request when the previous
//! response has been read in full. Loopback targets only are intended.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tensor_wasm_bench::INVOKE_ADD_BODY;
use tokio::net::TcpStream;

/// Longest run accepted, in seconds.
const MAX_DURATION_S: u64 = 60;
/// Most connections accepted.
const MAX_CONNECTIONS: usize = 1024;

/// Closed-loop HTTP/1.1 load generator (POST, keep-alive).
#[derive(Debug, Parser)]
struct Args {
    /// URL to POST to, e.g. http://127.0.0.1:8080/functions/fn-.../invoke (http only).
    #[arg(long)]
    url: String,
    /// Concurrent keep-alive connections.
    #[arg(long, short = 'c', default_value_t = 16)]
    connections: usize,
    /// Seconds to run (1 to 60).
    #[arg(long, short = 'd', default_value_t = 5)]
    duration_s: u64,
    /// Request body.
    #[arg(long, default_value = INVOKE_ADD_BODY)]
    body: String,
    /// Content type of the body.
    #[arg(long, default_value = "application/json")]
    content_type: String,
    /// Bearer token sent as `Authorization` on every request.
    #[arg(long, env = "LOADGEN_BEARER", hide_env_values = true)]
    bearer: Option<String>,
    /// Client threads (1 = a current-thread runtime, which leaves the most CPU to the server).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// Where and what to send; cloned into every connection task.
#[derive(Debug, Clone)]
struct Target {
    addr: String,
    host: HeaderValue,
    path: Uri,
    content_type: HeaderValue,
    authorization: Option<HeaderValue>,
    body: Bytes,
}

#[derive(Debug, Default)]
struct Stats {
    ok: u64,
    errors: u64,
    latencies_us: Vec<u64>,
}

fn target(args: &Args) -> anyhow::Result<Target> {
    let uri: Uri = args.url.parse().context("parsing --url")?;
    if uri.scheme_str() != Some("http") {
        bail!("only http:// URLs are supported");
    }
    let authority = uri.authority().context("the URL has no host")?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .parse()
        .context("parsing the URL path")?;
    Ok(Target {
        addr: format!("{}:{port}", authority.host()),
        host: HeaderValue::from_str(authority.as_str())?,
        path,
        content_type: HeaderValue::from_str(&args.content_type)?,
        authorization: args
            .bearer
            .as_ref()
            .map(|t| HeaderValue::from_str(&format!("Bearer {t}")))
            .transpose()?,
        body: Bytes::from(args.body.clone()),
    })
}

/// One request on an open connection: its status once the body is read.
async fn one_request(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    target: &Target,
) -> anyhow::Result<StatusCode> {
    let mut request = Request::post(target.path.clone())
        .header(HOST, target.host.clone())
        .header(CONTENT_TYPE, target.content_type.clone());
    if let Some(auth) = &target.authorization {
        request = request.header(AUTHORIZATION, auth.clone());
    }
    let request = request.body(Full::new(target.body.clone()))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    response.into_body().collect().await?;
    Ok(status)
}

/// One connection's closed loop until `deadline`; reconnects after a failure.
async fn connection(target: Target, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    while Instant::now() < deadline {
        let stream = match TcpStream::connect(&target.addr).await {
            Ok(stream) => stream,
            Err(_) => {
                stats.errors += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok(pair) => pair,
                Err(_) => {
                    stats.errors += 1;
                    continue;
                }
            };
        let driver = tokio::spawn(conn);
        let mut broken = false;
        while Instant::now() < deadline {
            let start = Instant::now();
            match one_request(&mut sender, &target).await {
                Ok(status) => {
                    stats.latencies_us.push(start.elapsed().as_micros() as u64);
                    if status.is_success() {
                        stats.ok += 1;
                    } else {
                        stats.errors += 1;
                    }
                }
                Err(_) => {
                    stats.errors += 1;
                    broken = true;
                    break;
                }
            }
        }
        drop(sender);
        if broken {
            driver.abort();
        } else {
            let _ = driver.await;
        }
    }
    stats
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let target = target(&args)?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.duration_s);
    let tasks: Vec<_> = (0..args.connections)
        .map(|_| tokio::spawn(connection(target.clone(), deadline)))
        .collect();
    let mut total = Stats::default();
    for task in tasks {
        let stats = task.await.context("a connection task panicked")?;
        total.ok += stats.ok;
        total.errors += stats.errors;
        total.latencies_us.extend(stats.latencies_us);
    }
    let seconds = start.elapsed().as_secs_f64();
    total.latencies_us.sort_unstable();
    let line = json!({
        "requests": total.ok,
        "errors": total.errors,
        "seconds": (seconds * 1000.0).round() / 1000.0,
        "req_per_s": (total.ok as f64 / seconds * 10.0).round() / 10.0,
        "p50_us": percentile(&total.latencies_us, 50.0),
        "p99_us": percentile(&total.latencies_us, 99.0),
        "connections": args.connections,
    });
    println!("{line}");
    Ok(total.ok > 0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.duration_s == 0 || args.duration_s > MAX_DURATION_S {
        bail!("--duration-s must be between 1 and {MAX_DURATION_S}");
    }
    if args.connections == 0 || args.connections > MAX_CONNECTIONS {
        bail!("--connections must be between 1 and {MAX_CONNECTIONS}");
    }
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    if runtime.block_on(run(args))? {
        Ok(())
    } else {
        bail!("no request succeeded")
    }
}
