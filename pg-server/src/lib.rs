//! Nyala's PostgreSQL front end: psql, psycopg, pgjdbc, psqlODBC and BI tools' PostgreSQL
//! connectors reach the same sessions, statements and privileges as Flight SQL clients.
//!
//! Built on `pgwire`: it speaks the protocol (startup, SSL negotiation, simple and extended
//! query, portals with row limits, cancel requests) and calls the handlers here, which go
//! through the server's session layer ([`nyala_server`]) exactly as the Flight SQL service
//! does. Each connection has one session, opened once the client has authenticated
//! ([`startup`]) and ended when the connection closes; statements run through it ([`query`])
//! and its errors become SQLSTATEs ([`errors`]). Results are encoded from Arrow by `arrow-pg`.
//!
//! A SQL `BEGIN` on a PostgreSQL connection opens a transaction that spans the connection's
//! following statements until `COMMIT` or `ROLLBACK`, as PostgreSQL's does.

mod catalog;
mod copy;
mod corked;
mod errors;
mod query;
mod results;
mod settings;
mod startup;

use std::collections::HashMap;
use std::sync::Arc;

use nyala_server::activity::Activity;
use nyala_server::auth::Auth;
use nyala_server::{ClientSession, Sessions};
use pgwire::api::cancel::CancelHandler;
use pgwire::api::{ConnectionManager, PgWireServerHandlers};
use pgwire::messages::cancel::CancelRequest;
use tokio::net::TcpListener;

pub use errors::sqlstate;

/// The server's TLS identity: its certificate chain and private key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// What every connection of a PostgreSQL listener shares.
struct Shared {
    sessions: Arc<Sessions>,
    activity: Arc<Activity>,
    auth: Auth,
    /// Requests in progress by the (pid, secret key) their connection was given, for
    /// CancelRequest.
    connections: Arc<ConnectionManager>,
    /// The session of each connection by its (pid, secret key): a CancelRequest cancels the
    /// statements it runs, also while their rows are being sent.
    cancel_keys: parking_lot::Mutex<HashMap<CancelKey, String>>,
    /// Whether connections must use TLS (the server has a certificate).
    tls: bool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// What a CancelRequest names a connection by: its process id and secret key.
type CancelKey = (i32, bytes::Bytes);

/// One client connection: the handlers pgwire calls for it, and its session once it has one.
struct Connection {
    shared: Arc<Shared>,
    id: u64,
    session: SessionCell,
    copy: query::CopyCell,
}

/// A connection's session, set once its client authenticated.
type SessionCell = Arc<std::sync::OnceLock<Arc<ClientSession>>>;

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(session) = self.session.get() {
            (self.shared.cancel_keys.lock()).retain(|_, id| id.as_str() != session.id());
        }
        self.shared.sessions.connection_closed(self.id);
    }
}

/// Answers CancelRequests: the statements of the connection named run no further.
struct Cancel {
    shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl CancelHandler for Cancel {
    async fn on_cancel_request(&self, request: CancelRequest) {
        let key = (request.pid, request.secret_key.to_bytes());
        let session = self.shared.cancel_keys.lock().get(&key).cloned();
        if let Some(session) = session {
            self.shared.activity.cancel_session(&session);
        }
        (self.shared.connections)
            .cancel(request.pid, &request.secret_key)
            .await;
    }
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        Arc::new(query::Queries::new(self))
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        Arc::new(query::Queries::new(self))
    }

    fn copy_handler(&self) -> Arc<impl pgwire::api::copy::CopyHandler> {
        Arc::new(query::Copies::new(self))
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        Arc::new(startup::Startup::new(self))
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(Cancel {
            shared: self.shared.clone(),
        })
    }
}

/// Serves the PostgreSQL protocol on `listener` until `shutdown` completes: clients of
/// `sessions`' database, authenticated by `auth`, their statements recorded in `activity`.
pub async fn serve(
    sessions: Arc<Sessions>,
    activity: Arc<Activity>,
    auth: Auth,
    listener: TcpListener,
    tls: Option<TlsIdentity>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let acceptor = tls.as_ref().map(tls_acceptor).transpose()?;
    let shared = Arc::new(Shared {
        sessions,
        activity,
        auth,
        connections: Arc::new(ConnectionManager::new()),
        cancel_keys: Default::default(),
        tls: tls.is_some(),
    });
    tokio::pin!(shutdown);
    loop {
        let (socket, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a PostgreSQL connection");
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let _ = socket.set_nodelay(true);
        let connection = Arc::new(Connection {
            id: shared.sessions.next_connection(),
            shared: shared.clone(),
            session: SessionCell::default(),
            copy: query::CopyCell::default(),
        });
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            if let Err(e) = pgwire::tokio::process_socket(socket, acceptor, connection).await {
                tracing::debug!(error = %e, "a PostgreSQL connection ended with an error");
            }
        });
    }
}

fn tls_acceptor(tls: &TlsIdentity) -> anyhow::Result<pgwire::tokio::TlsAcceptor> {
    use tokio_rustls::rustls;
    let certs = rustls_pemfile::certs(&mut tls.cert_pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("cannot read the TLS certificate: {e}"))?;
    let key = rustls_pemfile::private_key(&mut tls.key_pem.as_slice())
        .map_err(|e| anyhow::anyhow!("cannot read the TLS key: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("the TLS key file holds no private key"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(pgwire::tokio::TlsAcceptor::from(Arc::new(config)))
}
