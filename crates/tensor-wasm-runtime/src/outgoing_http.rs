//! Outgoing HTTP from components (`wasi:http/outgoing-handler`): refused with
//! `HTTP-request-denied` unless the request goes to an origin on the operator's allow-list
//! (`--outgoing-http-allow`, empty by default), and never waited for past the invocation's
//! deadline: the connection, the response head and every read of the response body end at it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// Where outgoing requests may go: a scheme, a host and a port, compared exactly (the host
/// without regard to ASCII case; a missing port is the scheme's, 80 or 443).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    https: bool,
    host: String,
    port: u16,
}

impl Origin {
    fn default_port(https: bool) -> u16 {
        if https {
            443
        } else {
            80
        }
    }

    /// Whether a request to `scheme://authority` goes to this origin.
    fn admits(&self, scheme: Option<&Scheme>, authority: Option<&Authority>) -> bool {
        let https = match scheme {
            Some(s) if *s == Scheme::HTTPS => true,
            Some(s) if *s == Scheme::HTTP => false,
            _ => return false,
        };
        let Some(authority) = authority else {
            return false;
        };
        https == self.https
            && authority.host().eq_ignore_ascii_case(&self.host)
            && authority.port_u16().unwrap_or(Self::default_port(https)) == self.port
    }
}

impl FromStr for Origin {
    type Err = String;

    /// `http://host[:port]` or `https://host[:port]`, nothing after the authority but `/`.
    fn from_str(text: &str) -> Result<Self, String> {
        let uri: http::Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not an origin ({e})"))?;
        let https = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => false,
            Some(s) if s.eq_ignore_ascii_case("https") => true,
            _ => {
                return Err(format!(
                    "{text:?}: an origin begins with http:// or https://"
                ))
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{text:?}: an origin names a host"))?;
        if authority.as_str().contains('@') || authority.host().is_empty() {
            return Err(format!(
                "{text:?}: an origin is a host and a port, without user info"
            ));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(format!(
                "{text:?}: an origin has no path or query (the allow-list admits every path)"
            ));
        }
        Ok(Origin {
            https,
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(Self::default_port(https)),
        })
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

/// The `wasi:http` hooks of one component invocation.
pub(crate) struct OutgoingHttp {
    allow: Arc<[Origin]>,
    /// The invocation's deadline (none outside an invocation).
    pub(crate) deadline: Option<Instant>,
}

impl OutgoingHttp {
    pub(crate) fn new(allow: Arc<[Origin]>) -> Self {
        OutgoingHttp {
            allow,
            deadline: None,
        }
    }
}

type SendResult = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
)>;

impl WasiHttpHooks for OutgoingHttp {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let uri = request.uri();
        if !self
            .allow
            .iter()
            .any(|origin| origin.admits(uri.scheme(), uri.authority()))
        {
            tracing::debug!(uri = %uri, "outgoing HTTP from a component refused (not on the allow-list)");
            return Box::new(std::future::ready(Err(Error::HttpRequestDenied)));
        }
        let deadline = self.deadline;
        // A client span under the invocation's, and its context on the request
        // (`traceparent`): the callee joins the trace.
        let span = tensor_wasm_telemetry::span!(
            "http client",
            otel.name = %request.method(),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            http.request.method = %request.method(),
            url.full = %request.uri(),
            server.address = request.uri().host().unwrap_or(""),
            http.response.status_code = tracing::field::Empty,
        );
        if !span.is_disabled() {
            let _in = span.enter();
            tensor_wasm_telemetry::inject_current(request.headers_mut());
        }
        let traced = span.clone();
        Box::new(tracing::Instrument::instrument(
            async move {
                let options = within(options, deadline);
                let send = wasmtime_wasi_http::default_send_request(request, Some(options));
                let (response, io) = match deadline {
                    Some(at) => tokio::time::timeout_at(at.into(), send)
                        .await
                        .map_err(|_| Error::ConnectionTimeout)??,
                    None => send.await?,
                };
                if !traced.is_disabled() {
                    traced.record("http.response.status_code", response.status().as_u16());
                    if response.status().is_server_error() {
                        traced.record("otel.status_code", "ERROR");
                    }
                }
                let response = response.map(|body| {
                    DeadlineBody {
                        body: body.boxed_unsync(),
                        deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at.into()))),
                    }
                    .boxed_unsync()
                });
                Ok((
                    response,
                    Box::new(io) as Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
                ))
            },
            span,
        ))
    }

    /// What an outgoing body's stream buffers is charged to the invocation when the body is
    /// opened (`component_charge`).
    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        crate::component_charge::BODY_BUFFER_CHUNKS
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        crate::component_charge::BODY_CHUNK_BYTES
    }
}

/// The guest's request options with no wait longer than what is left until `deadline`
/// (wasmtime's default for an unset one is 600 s).
fn within(options: Option<RequestOptions>, deadline: Option<Instant>) -> RequestOptions {
    let options = options.unwrap_or_default();
    let Some(deadline) = deadline else {
        return options;
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let bound = |wanted: Option<Duration>| Some(wanted.map_or(left, |w| w.min(left)));
    RequestOptions {
        connect_timeout: bound(options.connect_timeout),
        first_byte_timeout: bound(options.first_byte_timeout),
        between_bytes_timeout: bound(options.between_bytes_timeout),
    }
}

/// A response body that ends in `HTTP-response-timeout` at the invocation's deadline, so a
/// component reading a slow body gives its slot back on time.
struct DeadlineBody {
    body: WasiBody,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if let Some(sleep) = self.deadline.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(Error::HttpResponseTimeout)));
            }
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admits(origin: &str, uri: &str) -> bool {
        let origin: Origin = origin.parse().unwrap();
        let uri: http::Uri = uri.parse().unwrap();
        origin.admits(uri.scheme(), uri.authority())
    }

    #[test]
    fn origins_match_scheme_host_and_port_exactly() {
        assert!(admits("http://127.0.0.1:8081", "http://127.0.0.1:8081/x?y"));
        assert!(admits(
            "https://API.example.com",
            "https://api.example.com:443/"
        ));
        assert!(admits("http://example.com/", "http://example.com/a"));
        assert!(!admits("http://example.com", "https://example.com/"));
        assert!(!admits("http://example.com", "http://example.com:8080/"));
        assert!(!admits(
            "http://example.com",
            "http://example.com.evil.test/"
        ));
        assert!(!admits("http://example.com", "http://sub.example.com/"));
        assert!(admits("http://[::1]:9000", "http://[::1]:9000/"));
    }

    #[test]
    fn malformed_origins_are_refused_with_a_reason() {
        for (text, reason) in [
            ("example.com", "begins with http"),
            ("ftp://example.com", "begins with http"),
            ("http://example.com/api", "no path"),
            ("http://example.com/?q=1", "no path"),
            ("http://exa mple.com", "is not an origin"),
        ] {
            let err = text.parse::<Origin>().unwrap_err();
            assert!(err.contains(reason), "{text}: {err}");
        }
        // User info is refused, by the URI parser or by the check.
        assert!("http://user@example.com".parse::<Origin>().is_err());
        assert_eq!(
            "HTTPS://Example.COM".parse::<Origin>().unwrap().to_string(),
            "https://example.com:443"
        );
    }

    #[test]
    fn waits_end_at_the_deadline() {
        let soon = Instant::now() + Duration::from_secs(2);
        let options = within(None, Some(soon));
        for wait in [
            options.connect_timeout,
            options.first_byte_timeout,
            options.between_bytes_timeout,
        ] {
            assert!(wait.unwrap() <= Duration::from_secs(2));
        }
        let shorter = RequestOptions {
            connect_timeout: Some(Duration::from_millis(5)),
            ..RequestOptions::default()
        };
        assert_eq!(
            within(Some(shorter), Some(soon)).connect_timeout,
            Some(Duration::from_millis(5))
        );
        let past = within(None, Some(Instant::now() - Duration::from_secs(1)));
        assert_eq!(past.first_byte_timeout, Some(Duration::ZERO));
    }
}
