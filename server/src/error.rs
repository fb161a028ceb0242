//! What a request to the session layer fails with. Each front end says it in its protocol's
//! terms: Flight SQL as a gRPC status, PostgreSQL as an SQLSTATE.

use nyala_sql::SqlError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The statement failed (parse, privileges, planning, execution).
    #[error(transparent)]
    Sql(#[from] SqlError),
    /// Missing or wrong credentials, or a session whose login no longer holds.
    #[error("{0}")]
    Unauthenticated(String),
    /// The request names something the session does not have (a prepared statement, a query).
    #[error("{0}")]
    NotFound(String),
    /// The request is larger than a limit of what one request may ask ([`crate::limits`]).
    #[error("{0}")]
    TooLarge(String),
    /// The session holds as much of something as it may ([`crate::limits`]).
    #[error("{0}")]
    TooMany(String),
}

impl ServerError {
    /// The class of the error, as the statement metrics count it.
    pub fn class(&self) -> &'static str {
        match self {
            ServerError::Sql(e) => match e {
                SqlError::Parse(_) => "syntax",
                SqlError::PermissionDenied(_) => "permission",
                SqlError::Conflict(_) => "conflict",
                SqlError::NotSupported(_) => "unsupported",
                SqlError::Exhausted(_) => "resources",
                SqlError::Cancelled(_) => "cancelled",
                SqlError::Engine(
                    nyala_engine::EngineError::Busy(_)
                    | nyala_engine::EngineError::Unavailable(_)
                    | nyala_engine::EngineError::OutcomeUnknown(_),
                ) => "unavailable",
                _ => "invalid",
            },
            ServerError::Unauthenticated(_) => "unauthenticated",
            ServerError::NotFound(_) => "not_found",
            ServerError::TooLarge(_) => "invalid",
            ServerError::TooMany(_) => "resources",
        }
    }

    /// A statement stopped because it was cancelled.
    pub fn cancelled() -> Self {
        ServerError::Sql(SqlError::Cancelled("the statement was cancelled".into()))
    }

    /// A mistake in the request, said in `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        ServerError::Sql(SqlError::Invalid(message.into()))
    }
}

pub type Result<T, E = ServerError> = std::result::Result<T, E>;
