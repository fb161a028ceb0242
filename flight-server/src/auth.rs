//! Username/password authentication with bearer tokens, as Flight SQL clients (JDBC, ADBC,
//! pyarrow) do it: the handshake carries `authorization: Basic base64(user:password)` and the
//! server answers with `authorization: Bearer <token>`, which every later call carries.
//!
//! The check runs as a tonic interceptor in front of every RPC, so no Flight SQL method can
//! forget it. When no credentials are configured every call is accepted.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use base64::Engine;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

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

/// The server's authentication state: configured credentials and the tokens handed out.
#[derive(Clone, Default)]
pub struct Auth {
    inner: Option<Arc<AuthInner>>,
}

struct AuthInner {
    credentials: Credentials,
    tokens: Mutex<HashSet<String>>,
}

/// What a request's `authorization` header proves.
enum Caller {
    /// Authentication is off.
    Anyone,
    /// Valid username and password (a handshake).
    Password,
    /// A token this server issued.
    Token(String),
}

impl Auth {
    pub fn new(credentials: Option<Credentials>) -> Self {
        Self {
            inner: credentials.map(|credentials| {
                Arc::new(AuthInner {
                    credentials,
                    tokens: Mutex::default(),
                })
            }),
        }
    }

    fn identify(&self, metadata: &MetadataMap) -> Result<Caller, Status> {
        let Some(inner) = &self.inner else {
            return Ok(Caller::Anyone);
        };
        let header = metadata
            .get("authorization")
            .ok_or_else(|| {
                Status::unauthenticated(
                    "authentication required: connect with a username and password",
                )
            })?
            .to_str()
            .map_err(|_| Status::unauthenticated("malformed authorization header"))?;
        if let Some(token) = header.strip_prefix("Bearer ") {
            let known = inner
                .tokens
                .lock()
                .map(|t| t.contains(token))
                .unwrap_or(false);
            return if known {
                Ok(Caller::Token(token.to_string()))
            } else {
                Err(Status::unauthenticated(
                    "invalid or expired token: authenticate again",
                ))
            };
        }
        if let Some(encoded) = header.strip_prefix("Basic ") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| Status::unauthenticated("malformed basic authorization header"))?;
            let (user, password) = decoded.split_once(':').unwrap_or((decoded.as_str(), ""));
            let c = &inner.credentials;
            return if user == c.username && password == c.password {
                Ok(Caller::Password)
            } else {
                Err(Status::unauthenticated("invalid username or password"))
            };
        }
        Err(Status::unauthenticated(
            "unsupported authorization scheme: use Basic or Bearer",
        ))
    }

    /// The handshake: a bearer token for a caller that presented valid credentials (the same
    /// token if it presented one), or None when authentication is off.
    pub fn handshake(&self, metadata: &MetadataMap) -> Result<Option<String>, Status> {
        match self.identify(metadata)? {
            Caller::Anyone => Ok(None),
            Caller::Token(token) => Ok(Some(token)),
            Caller::Password => {
                let token = uuid::Uuid::new_v4().simple().to_string();
                if let Some(inner) = &self.inner {
                    inner
                        .tokens
                        .lock()
                        .map_err(|_| Status::internal("token store poisoned"))?
                        .insert(token.clone());
                }
                Ok(Some(token))
            }
        }
    }
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.identify(request.metadata())?;
        Ok(request)
    }
}
