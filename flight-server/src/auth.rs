//! Username/password authentication with bearer tokens, as Flight SQL clients (JDBC, ADBC,
//! pyarrow) do it: the handshake carries `authorization: Basic base64(user:password)` and the
//! server answers with `authorization: Bearer <token>`, which every later call carries.
//!
//! [`Auth::identify`] reads what a request's `authorization` header claims; the session layer
//! ([`crate::session::SessionLayer`]) runs it in front of every RPC, so no Flight SQL method can
//! forget it, and checks tokens against the sessions they were issued in (a token ends with its
//! session). When no credentials are configured every call is accepted.

use std::sync::Arc;

use base64::Engine;
use tonic::Status;

/// The one user a server accepts.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The server's configured credentials, if any.
#[derive(Clone, Default)]
pub struct Auth {
    credentials: Option<Arc<Credentials>>,
}

/// What a request's `authorization` header proves.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Authentication is off.
    Anyone,
    /// Valid username and password (a handshake).
    Password,
    /// A bearer token, still to be matched with its session.
    Token(String),
}

impl Auth {
    pub fn new(credentials: Option<Credentials>) -> Self {
        Self {
            credentials: credentials.map(Arc::new),
        }
    }

    /// Who the request's headers say the caller is; an error for a missing or wrong password.
    pub fn identify(&self, headers: &http::HeaderMap) -> Result<Caller, Status> {
        let Some(credentials) = &self.credentials else {
            return Ok(Caller::Anyone);
        };
        let header = headers
            .get(http::header::AUTHORIZATION)
            .ok_or_else(|| {
                Status::unauthenticated(
                    "authentication required: connect with a username and password",
                )
            })?
            .to_str()
            .map_err(|_| Status::unauthenticated("malformed authorization header"))?;
        if let Some(token) = header.strip_prefix("Bearer ") {
            return Ok(Caller::Token(token.trim().to_string()));
        }
        if let Some(encoded) = header.strip_prefix("Basic ") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| Status::unauthenticated("malformed basic authorization header"))?;
            let (user, password) = decoded.split_once(':').unwrap_or((decoded.as_str(), ""));
            return if user == credentials.username && password == credentials.password {
                Ok(Caller::Password)
            } else {
                Err(Status::unauthenticated("invalid username or password"))
            };
        }
        Err(Status::unauthenticated(
            "unsupported authorization scheme: use Basic or Bearer",
        ))
    }
}
