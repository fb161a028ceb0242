//! Accepted client connections: TCP_NODELAY and keepalive on every socket, and an identity
//! per connection for the sessions of clients that send neither a session cookie nor a token.
//!
//! Without TCP_NODELAY a small response waits for the client's delayed ACK (Nagle's algorithm),
//! which put a 40 ms floor under every statement. Each connection gets a [`ConnectionInfo`] in
//! the extensions of its requests; when the connection closes and its last request is done,
//! the info's last clone drops and tells the session registry, which ends the sessions that
//! belonged to that connection alone.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::Connected;

use nyala_server::Sessions;

/// How long an idle connection waits before TCP keepalive probes start.
pub const KEEPALIVE: Duration = Duration::from_secs(60);

/// A client connection, as the Flight SQL server sees it.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    pub id: u64,
    pub remote: Option<std::net::SocketAddr>,
    _open: Arc<OpenConnection>,
}

/// Lives as long as the connection (and its requests); its drop ends the connection's sessions.
#[derive(Debug)]
struct OpenConnection {
    id: u64,
    sessions: Weak<Sessions>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(sessions) = self.sessions.upgrade() {
            sessions.connection_closed(self.id);
        }
    }
}

/// An accepted TCP connection with its identity.
pub struct Connection {
    stream: TcpStream,
    info: ConnectionInfo,
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Sets TCP_NODELAY and keepalive on `stream`.
pub fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// The connections accepted on `listener`, tuned and numbered.
pub fn incoming(
    listener: TcpListener,
    sessions: &Arc<Sessions>,
) -> impl Stream<Item = io::Result<Connection>> + Send + 'static {
    let sessions = Arc::downgrade(sessions);
    futures::stream::unfold(listener, move |listener| {
        let sessions = sessions.clone();
        async move {
            let accepted = listener.accept().await.and_then(|(stream, remote)| {
                tune(&stream)?;
                let id = sessions
                    .upgrade()
                    .map_or(0, |sessions| sessions.next_connection());
                let info = ConnectionInfo {
                    id,
                    remote: Some(remote),
                    _open: Arc::new(OpenConnection { id, sessions }),
                };
                Ok(Connection { stream, info })
            });
            Some((accepted, listener))
        }
    })
}
