//! TLS to PostgreSQL, with rustls.
//!
//! A database URL with `sslmode=require` is connected over TLS, and the server's certificate is
//! always verified, chain and host name (libpq's `verify-full`; this store knows no weaker
//! checking): against the PEM file named by `sslrootcert=<path>` in the URL (libpq's parameter,
//! read here because `tokio-postgres` does not know it), or else the system's roots. Without
//! `sslmode=require` the connection is plain, as before (`prefer` does not try TLS here).

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, NoTlsStream, TlsConnect, TlsStream};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Socket};

use crate::error::SharedStoreError;
use crate::store::Shared;

/// A connection to drive: plain or over TLS.
pub(crate) enum Connection {
    Plain(Box<tokio_postgres::Connection<Socket, NoTlsStream>>),
    Tls(Box<tokio_postgres::Connection<Socket, RustlsStream>>),
}

impl Connection {
    /// Polls for the next message from the server (notifications, notices); `None` once the
    /// connection has closed.
    pub(crate) fn poll_message(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<AsyncMessage, tokio_postgres::Error>>> {
        match self {
            Connection::Plain(c) => c.poll_message(cx),
            Connection::Tls(c) => c.poll_message(cx),
        }
    }

    /// Drives the connection until it closes.
    pub(crate) async fn run(self) -> Result<(), tokio_postgres::Error> {
        match self {
            Connection::Plain(c) => (*c).await,
            Connection::Tls(c) => (*c).await,
        }
    }
}

/// Connects to the database at `url` (TLS as the module says), with the settings `tune` adds
/// to the URL's; the caller drives the connection.
pub(crate) async fn connect(
    url: &str,
    tune: impl FnOnce(&mut Config),
) -> Shared<(Client, Connection)> {
    let (mut config, root) = parse(url)?;
    tune(&mut config);
    if config.get_ssl_mode() == SslMode::Require {
        let tls = MakeRustls::new(root.as_deref())?;
        let (client, connection) = config.connect(tls).await?;
        Ok((client, Connection::Tls(Box::new(connection))))
    } else {
        let (client, connection) = config.connect(NoTls).await?;
        Ok((client, Connection::Plain(Box::new(connection))))
    }
}

/// The client's configuration from `url`, and the CA file its `sslrootcert` names.
fn parse(url: &str) -> Shared<(Config, Option<PathBuf>)> {
    let bad = |e: &dyn std::fmt::Display| SharedStoreError::Config(format!("database URL: {e}"));
    let mut root = None;
    let url = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let mut parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
        let kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter_map(|(key, value)| {
                if key == "sslrootcert" {
                    root = Some(PathBuf::from(value.into_owned()));
                    None
                } else {
                    Some((key.into_owned(), value.into_owned()))
                }
            })
            .collect();
        parsed.set_query(None);
        if !kept.is_empty() {
            parsed.query_pairs_mut().extend_pairs(kept);
        }
        parsed.to_string()
    } else {
        url.to_owned()
    };
    let config: Config = url.parse().map_err(|e| bad(&e))?;
    if root.is_some() && config.get_ssl_mode() != SslMode::Require {
        return Err(SharedStoreError::Config(
            "database URL: sslrootcert needs sslmode=require".into(),
        ));
    }
    Ok((config, root))
}

/// Makes rustls connectors that verify the server against `roots`.
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl MakeRustls {
    fn new(root: Option<&Path>) -> Shared<Self> {
        let mut roots = rustls::RootCertStore::empty();
        match root {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                    SharedStoreError::Config(format!("sslrootcert {}: {e}", path.display()))
                })?;
                for cert in certs {
                    let cert = cert.map_err(|e| {
                        SharedStoreError::Config(format!("sslrootcert {}: {e}", path.display()))
                    })?;
                    roots.add(cert).map_err(|e| {
                        SharedStoreError::Config(format!("sslrootcert {}: {e}", path.display()))
                    })?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err(SharedStoreError::Config(
                "sslmode=require: no CA certificate to verify the database server with; name a \
                 PEM file with sslrootcert=<path> in the database URL"
                    .into(),
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| SharedStoreError::Config(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

impl MakeTlsConnect<Socket> for MakeRustls {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(RustlsConnect {
            connector: tokio_rustls::TlsConnector::from(self.config.clone()),
            name,
        })
    }
}

/// One TLS handshake with the server named `name`.
pub(crate) struct RustlsConnect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let stream = self.connector.connect(self.name, stream).await?;
            Ok(RustlsStream(stream))
        })
    }
}

/// A connection's stream over TLS.
pub(crate) struct RustlsStream(tokio_rustls::client::TlsStream<Socket>);

impl AsyncRead for RustlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding; the certificate check above is what authenticates
        // the server.
        ChannelBinding::none()
    }
}
