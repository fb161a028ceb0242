//! Username/password authentication with bearer tokens, as Flight SQL clients (JDBC, ADBC,
//! pyarrow) do it: the handshake carries `authorization: Basic base64(user:password)` and the
//! server answers with `authorization: Bearer <token>`, which every later call carries.
//!
//! [`Auth::identify`] reads what a request's `authorization` header claims; the session layer
//! ([`crate::session::SessionLayer`]) runs it in front of every RPC, so no Flight SQL method can
//! forget it, and checks tokens against the sessions they were issued in (a token ends with its
//! session). Users live in the catalog (`CREATE USER`); until it has one, every call is
//! accepted.

use std::sync::Arc;

use base64::Engine;
use nyala_engine::{Client, UserInfo};
use tonic::Status;

/// Base64 with or without `=` padding: ADBC's Go client leaves it out.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

pub use nyala_server::auth::Credentials;

/// Checks requests' credentials against the users in the catalog.
#[derive(Clone)]
pub struct Auth {
    auth: nyala_server::auth::Auth,
}

/// What a request's `authorization` header proves.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Authentication is off (the catalog has no users).
    Anyone,
    /// This user, whose password the request carried.
    Password(Arc<UserInfo>),
    /// A bearer token, still to be matched with its session.
    Token(String),
}

impl Auth {
    pub fn new(client: Client) -> Self {
        Self {
            auth: nyala_server::auth::Auth::new(client),
        }
    }

    /// The session layer's password checks.
    pub fn shared(&self) -> &nyala_server::auth::Auth {
        &self.auth
    }

    /// Who the request's headers say the caller is; an error for missing credentials or a
    /// wrong password. Authentication is on once the catalog has a user.
    pub async fn identify(&self, headers: &http::HeaderMap) -> Result<Caller, Status> {
        if !self.auth.required() {
            return Ok(Caller::Anyone);
        }
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
        let Some(encoded) = header.strip_prefix("Basic ") else {
            return Err(Status::unauthenticated(
                "unsupported authorization scheme: use Basic or Bearer",
            ));
        };
        let decoded = BASE64
            .decode(encoded.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| Status::unauthenticated("malformed basic authorization header"))?;
        let (name, password) = decoded.split_once(':').unwrap_or((decoded.as_str(), ""));
        let user = self
            .auth
            .verify(name, password)
            .await
            .map_err(crate::status)?;
        Ok(Caller::Password(user))
    }
}
