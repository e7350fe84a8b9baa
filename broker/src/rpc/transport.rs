//! What carries the frames of a cluster-port connection: plain TCP, or TCP under mutual TLS
//! (SPEC §4.5), and what both ends need to authenticate on it ([`ClusterAuth`]).
//!
//! With TLS the HMAC proof of the handshake (see `auth`) is bound to the TLS session: both
//! ends mix 32 bytes of the session's exported keying material (RFC 8446 §7.5, label
//! [`EXPORTER_LABEL`]) into the proof, so a proof seen on one session is worthless on another
//! and a TLS-terminating middlebox cannot relay the handshake. Plaintext binds nothing (the
//! proof is then exactly the pre-TLS one, so old peers keep working).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::auth::ClusterSecret;
use crate::tls::ReloadingTls;

/// The RFC 5705/8446 exporter label whose output binds a proof to its TLS session.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-narad-cluster-auth-v1";
/// Bytes of exported keying material mixed into the proof.
pub const BINDING_LEN: usize = 32;

/// What a node proves and checks on the cluster port: the shared secret and, when
/// configured, the mutual-TLS identity. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ClusterAuth {
    pub secret: ClusterSecret,
    pub tls: Option<Arc<ReloadingTls>>,
}

impl ClusterAuth {
    pub fn new(secret: ClusterSecret, tls: Option<Arc<ReloadingTls>>) -> ClusterAuth {
        ClusterAuth { secret, tls }
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

impl From<ClusterSecret> for ClusterAuth {
    fn from(secret: ClusterSecret) -> ClusterAuth {
        ClusterAuth { secret, tls: None }
    }
}

type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// The read side of a connection.
pub enum ReadHalf {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsStream>),
}

/// The write side of a connection.
pub enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<TlsStream>),
}

/// An established connection, split, with its session binding (empty for plaintext).
pub struct Split {
    pub read: ReadHalf,
    pub write: WriteHalf,
    pub binding: Vec<u8>,
}

fn binding(conn: &rustls::ConnectionCommon<impl Sized>) -> io::Result<Vec<u8>> {
    conn.export_keying_material(vec![0u8; BINDING_LEN], EXPORTER_LABEL, None)
        .map_err(|e| io::Error::other(format!("tls exporter: {e}")))
}

/// Plain TCP.
pub fn plain(stream: TcpStream) -> Split {
    let (r, w) = stream.into_split();
    Split {
        read: ReadHalf::Plain(r),
        write: WriteHalf::Plain(w),
        binding: Vec::new(),
    }
}

/// The server side of the TLS handshake on an accepted stream (client certificate required).
pub async fn accept_tls(stream: TcpStream, tls: &ReloadingTls) -> io::Result<Split> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current().server);
    let s = acceptor.accept(stream).await?;
    let binding = binding(s.get_ref().1)?;
    Ok(tls_split(TlsStream::Server(s), binding))
}

/// The client side of the TLS handshake to `addr` (its certificate must name the host).
pub async fn connect_tls(stream: TcpStream, addr: &str, tls: &ReloadingTls) -> io::Result<Split> {
    let client = tls
        .current()
        .client
        .ok_or_else(|| io::Error::other("cluster TLS has no client configuration"))?;
    let name = crate::tls::server_name(addr).map_err(io::Error::other)?;
    let s = tokio_rustls::TlsConnector::from(client)
        .connect(name, stream)
        .await?;
    let binding = binding(s.get_ref().1)?;
    Ok(tls_split(TlsStream::Client(s), binding))
}

fn tls_split(s: TlsStream, binding: Vec<u8>) -> Split {
    let (r, w) = tokio::io::split(s);
    Split {
        read: ReadHalf::Tls(r),
        write: WriteHalf::Tls(w),
        binding,
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Plain(w) => w.is_write_vectored(),
            WriteHalf::Tls(w) => w.is_write_vectored(),
        }
    }
}
