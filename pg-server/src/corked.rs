//! A client connection whose flushes wait for the client's Sync. In the extended protocol a
//! client sends Bind, Execute and Sync together and reads the answers together; PostgreSQL
//! sends them together, flushing only when it is about to wait for the client (at Sync, at a
//! Flush message, or when its buffer fills). pgwire flushes after BindComplete and after
//! CommandComplete too: three writes to the socket per statement where one does, which was a
//! third of the server's CPU under many small prepared lookups. Answers written through
//! [`Corked`] stay buffered until pgwire flushes at Sync or Flush (its buffer still writes out
//! when it fills, so large results stream).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Sink;
use pgwire::api::{ClientInfo, ClientPortalStore, PgWireConnectionState, SessionExtensions};
use pgwire::messages::response::TransactionStatus;
use pgwire::messages::startup::SecretKey;
use pgwire::messages::{PgWireBackendMessage, ProtocolVersion};
use tokio_rustls::rustls::pki_types::CertificateDer;

/// `client`, whose flushes do nothing (see the module's comment).
pub(crate) struct Corked<'a, C>(pub &'a mut C);

impl<C> Sink<PgWireBackendMessage> for Corked<'_, C>
where
    C: Sink<PgWireBackendMessage> + Unpin,
{
    type Error = C::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        Pin::new(&mut *self.0).poll_ready(cx)
    }

    fn start_send(mut self: Pin<&mut Self>, item: PgWireBackendMessage) -> Result<(), C::Error> {
        Pin::new(&mut *self.0).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        Pin::new(&mut *self.0).poll_close(cx)
    }
}

impl<C: ClientPortalStore> ClientPortalStore for Corked<'_, C> {
    type PortalStore = C::PortalStore;

    fn portal_store(&self) -> &Self::PortalStore {
        self.0.portal_store()
    }
}

impl<C: ClientInfo> ClientInfo for Corked<'_, C> {
    fn socket_addr(&self) -> SocketAddr {
        self.0.socket_addr()
    }

    fn is_secure(&self) -> bool {
        self.0.is_secure()
    }

    fn protocol_version(&self) -> ProtocolVersion {
        self.0.protocol_version()
    }

    fn set_protocol_version(&mut self, version: ProtocolVersion) {
        self.0.set_protocol_version(version)
    }

    fn pid_and_secret_key(&self) -> (i32, SecretKey) {
        self.0.pid_and_secret_key()
    }

    fn set_pid_and_secret_key(&mut self, pid: i32, secret_key: SecretKey) {
        self.0.set_pid_and_secret_key(pid, secret_key)
    }

    fn state(&self) -> PgWireConnectionState {
        self.0.state()
    }

    fn set_state(&mut self, new_state: PgWireConnectionState) {
        self.0.set_state(new_state)
    }

    fn transaction_status(&self) -> TransactionStatus {
        self.0.transaction_status()
    }

    fn set_transaction_status(&mut self, new_status: TransactionStatus) {
        self.0.set_transaction_status(new_status)
    }

    fn metadata(&self) -> &HashMap<String, String> {
        self.0.metadata()
    }

    fn metadata_mut(&mut self) -> &mut HashMap<String, String> {
        self.0.metadata_mut()
    }

    fn session_extensions(&self) -> &SessionExtensions {
        self.0.session_extensions()
    }

    fn sni_server_name(&self) -> Option<&str> {
        self.0.sni_server_name()
    }

    fn client_certificates<'a>(&self) -> Option<&[CertificateDer<'a>]> {
        self.0.client_certificates()
    }
}
