//! Which session a Flight SQL request belongs to: the one named by its `arrow_flight_session_id`
//! cookie (the Flight SQL session cookie, which the JDBC driver keeps), else the one its bearer
//! token was issued in, else the one of its gRPC connection (ADBC and pyarrow send neither). A
//! new session's first response sets the cookie; `CloseSession` ends it. The sessions
//! themselves are the server's session layer's ([`nyala_server::session`]).
//!
//! This runs as a tower layer in front of the Flight service ([`SessionLayer`]): it
//! authenticates the request, finds or creates its session and hands it to the handlers in the
//! request's extensions ([`session_of`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use nyala_server::{ClientSession, Sessions};
use tonic::Status;

use crate::auth::{Auth, Caller};
use crate::connection::ConnectionInfo;

/// The Flight SQL session cookie.
pub const SESSION_COOKIE: &str = "arrow_flight_session_id";

/// The session the [`SessionLayer`] attached to a request.
#[derive(Clone)]
pub struct SessionRef(pub Arc<ClientSession>);

/// The session of a request.
pub fn session_of<T>(request: &tonic::Request<T>) -> Result<Arc<ClientSession>, Status> {
    request
        .extensions()
        .get::<SessionRef>()
        .map(|s| s.0.clone())
        .ok_or_else(|| Status::internal("the request has no session"))
}

/// The caller a request was authenticated as.
pub fn caller_of<T>(request: &tonic::Request<T>) -> Caller {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or(Caller::Anyone)
}

/// The value of cookie `name` in a request's `cookie` headers.
fn cookie<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim_matches('"'))
}

/// A `set-cookie` header value for session `id`; `expire` clears the cookie.
pub fn session_cookie(id: &str, expire: bool) -> String {
    match expire {
        false => format!("{SESSION_COOKIE}={id}"),
        true => format!("{SESSION_COOKIE}={id}; Max-Age=0"),
    }
}

/// Authenticates every request and attaches its session (see the module comment).
#[derive(Clone)]
pub struct SessionLayer {
    pub sessions: Arc<Sessions>,
    pub auth: Auth,
}

impl<S> tower::Layer<S> for SessionLayer {
    type Service = SessionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SessionService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct SessionService<S> {
    inner: S,
    layer: SessionLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for SessionService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let layer = self.layer.clone();
        // The service that was polled ready handles this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let attached = layer
                .attach(request.headers(), connection_of(request.extensions()))
                .await;
            let (caller, session, created) = match attached {
                Ok(attached) => attached,
                Err(status) => return Ok(status.into_http()),
            };
            let id = session.id().to_string();
            request.extensions_mut().insert(caller);
            request.extensions_mut().insert(SessionRef(session));
            let mut response = inner.call(request).await?;
            // Session ids are hex digits: always a valid header value.
            if let (true, Ok(cookie)) = (
                created,
                http::HeaderValue::from_str(&session_cookie(&id, false)),
            ) {
                response
                    .headers_mut()
                    .append(http::header::SET_COOKIE, cookie);
            }
            Ok(response)
        })
    }
}

impl SessionLayer {
    /// Authenticates a request and finds its session (and whether it was created for it).
    async fn attach(
        &self,
        headers: &http::HeaderMap,
        connection: Option<&ConnectionInfo>,
    ) -> Result<(Caller, Arc<ClientSession>, bool), Status> {
        let caller = self.auth.identify(headers).await?;
        let token = match &caller {
            Caller::Token(token) => Some(token.as_str()),
            _ => None,
        };
        let (session, created) = self
            .sessions
            .resolve(
                cookie(headers, SESSION_COOKIE),
                token,
                connection.map(|c| c.id),
            )
            .map_err(crate::status)?;
        match &caller {
            Caller::Password(user) => session.sql().log_in(user),
            Caller::Token(_) | Caller::Anyone => {
                let login = session.sql().login();
                if login.is_some_and(|login| !self.auth.shared().still_valid(&login)) {
                    self.sessions.close(session.id());
                    return Err(Status::unauthenticated(
                        "the session's user was dropped or its password changed: authenticate \
                         again",
                    ));
                }
            }
        }
        Ok((caller, session, created))
    }
}

/// The connection a request came on, with or without TLS.
fn connection_of(extensions: &http::Extensions) -> Option<&ConnectionInfo> {
    extensions.get::<ConnectionInfo>().or_else(|| {
        extensions
            .get::<tonic::transport::server::TlsConnectInfo<ConnectionInfo>>()
            .map(|tls| tls.get_ref())
    })
}
