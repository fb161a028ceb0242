//! A connection's start: SSL negotiation is pgwire's; then the client authenticates (when the
//! catalog has users) with SCRAM-SHA-256 against the verifier stored beside each user's
//! password hash, and the connection's session opens, logged in as that user.
//!
//! Users whose password was set before Nyala stored SCRAM verifiers have none: they log in over
//! Flight SQL until their password is set again (`ALTER USER ... PASSWORD`).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::sasl::scram::ScramAuth;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler,
};
use pgwire::api::{
    ClientInfo, PgWireConnectionState, PidSecretKeyGenerator, RandomPidSecretKeyGenerator,
    METADATA_USER,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use crate::{Connection, SessionCell, Shared};

/// What the server tells a client at its start (server_version, DateStyle, ...).
fn parameters() -> DefaultServerParameterProvider {
    let mut parameters = DefaultServerParameterProvider::default();
    parameters.server_version = format!("16.6 (Nyala {})", env!("CARGO_PKG_VERSION"));
    parameters
}

/// The startup of one connection.
pub(crate) struct Startup {
    shared: Arc<Shared>,
    connection: u64,
    session: SessionCell,
    parameters: Arc<DefaultServerParameterProvider>,
    /// SCRAM's exchange (its state is this connection's).
    sasl: SASLAuthStartupHandler<DefaultServerParameterProvider>,
}

impl Startup {
    pub(crate) fn new(connection: &Connection) -> Self {
        let parameters = Arc::new(parameters());
        let verifiers = Arc::new(Verifiers {
            shared: connection.shared.clone(),
        });
        let mut scram = ScramAuth::new(verifiers);
        scram.set_iterations(nyala_engine::SCRAM_ITERATIONS);
        let sasl = SASLAuthStartupHandler::new(parameters.clone())
            .with_scram(scram)
            .with_connection_manager(connection.shared.connections.clone());
        Self {
            shared: connection.shared.clone(),
            connection: connection.id,
            session: connection.session.clone(),
            parameters,
            sasl,
        }
    }

    /// Opens the connection's session once its client has authenticated (as `user`, when the
    /// server authenticates).
    fn open_session<C: ClientInfo>(&self, client: &C) -> PgWireResult<()> {
        if self.session.get().is_some() {
            return Ok(());
        }
        let session = self.shared.sessions.open(self.connection);
        crate::catalog::install(&session);
        if self.shared.auth.required() {
            let name = client.metadata().get(METADATA_USER).cloned();
            let user = name.as_deref().and_then(|name| self.shared.auth.user(name));
            let Some(user) = user else {
                return Err(refused("invalid username or password"));
            };
            session.sql().log_in(&user);
        }
        let (pid, secret) = client.pid_and_secret_key();
        let key = (pid, secret.to_bytes());
        (self.shared.cancel_keys.lock()).insert(key, session.id().to_string());
        let _ = self.session.set(session);
        Ok(())
    }
}

fn refused(message: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".into(),
        "28P01".into(),
        message.into(),
    )))
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let PgWireFrontendMessage::Startup(startup) = &message {
            if self.shared.tls && !client.is_secure() {
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "FATAL".into(),
                    "28000".into(),
                    "this server accepts only TLS connections (sslmode=require)".into(),
                ))));
            }
            if !self.shared.auth.required() {
                // Authentication is off: the client is in as soon as it starts.
                pgwire::api::auth::protocol_negotiation(client, startup).await?;
                pgwire::api::auth::save_startup_parameters_to_metadata(client, startup);
                let (pid, secret) = RandomPidSecretKeyGenerator::default().generate(client);
                client.set_pid_and_secret_key(pid, secret);
                let (handle, guard) = self.shared.connections.register(pid, secret_key(client));
                client.session_extensions().insert(handle);
                client.session_extensions().insert(guard);
                self.open_session(client)?;
                pgwire::api::auth::finish_authentication(client, self.parameters.as_ref()).await?;
                return Ok(());
            }
        }
        self.sasl.on_startup(client, message).await?;
        if matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            self.open_session(client)?;
        }
        Ok(())
    }
}

fn secret_key<C: ClientInfo>(client: &C) -> pgwire::messages::startup::SecretKey {
    client.pid_and_secret_key().1
}

/// The SCRAM verifiers of the catalog's users.
#[derive(Debug)]
struct Verifiers {
    shared: Arc<Shared>,
}

#[async_trait]
impl AuthSource for Verifiers {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let user = login.user().and_then(|name| self.shared.auth.user(name));
        let verifier = user.as_ref().and_then(|user| user.scram.as_ref());
        match verifier.and_then(|v| v.salted()) {
            Some((salt, salted)) => Ok(Password::new(Some(salt), salted)),
            None if user.is_some() => Err(refused(
                "this user's password was set before PostgreSQL clients could log in: set it \
                 again (ALTER USER ... PASSWORD) to log in over PostgreSQL",
            )),
            // An unknown user goes through the exchange as a wrong password does, so the
            // answer does not tell which users exist.
            None => Ok(Password::new(
                Some(rand::random::<[u8; 16]>().to_vec()),
                rand::random::<[u8; 32]>().to_vec(),
            )),
        }
    }
}
