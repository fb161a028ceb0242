//! The session layer's errors as PostgreSQL reports errors: an ErrorResponse with an SQLSTATE
//! code clients act on (psycopg raises `UniqueViolation` for 23505, pgjdbc retries 40001, ...).

use nyala_engine::EngineError;
use nyala_server::ServerError;
use nyala_sql::SqlError;
use pgwire::error::{ErrorInfo, PgWireError};

/// `e` as an ErrorResponse.
pub fn error_info(e: &ServerError) -> ErrorInfo {
    ErrorInfo::new("ERROR".into(), sqlstate(e).into(), e.to_string())
}

/// `e` as the error a handler returns.
pub fn pg_error(e: impl Into<ServerError>) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(&e.into())))
}

/// The SQLSTATE of `e` (PostgreSQL's Appendix A).
pub fn sqlstate(e: &ServerError) -> &'static str {
    match e {
        ServerError::Sql(e) => sql_state(e),
        ServerError::Unauthenticated(_) => "28P01",
        ServerError::NotFound(_) => "26000",
        ServerError::TooLarge(_) => "54000",
        ServerError::TooMany(_) => "53000",
    }
}

fn sql_state(e: &SqlError) -> &'static str {
    match e {
        SqlError::Parse(_) => "42601",
        SqlError::PermissionDenied(_) => "42501",
        SqlError::Conflict(_) => "40001",
        SqlError::NotSupported(_) => "0A000",
        SqlError::Cancelled(_) => "57014",
        SqlError::Exhausted(message) if message.contains("statement_timeout") => "57014",
        SqlError::Exhausted(_) => "53000",
        SqlError::Engine(e) => engine_state(e),
        SqlError::Invalid(message) | SqlError::DataFusion(message) => from_message(message),
        SqlError::Arrow(e) => from_message(&e.to_string()),
    }
}

fn engine_state(e: &EngineError) -> &'static str {
    use nyala_engine::storage::StorageError;
    match e {
        EngineError::TableNotFound(_) => "42P01",
        EngineError::TableExists(_) => "42P07",
        EngineError::InvalidTable(_) => "42P16",
        EngineError::Unsupported(_) => "0A000",
        EngineError::Busy(_) => "53000",
        EngineError::Unavailable(_) | EngineError::NotLeaderMaster { .. } => "57P03",
        EngineError::OutcomeUnknown(_) => "40003",
        EngineError::Storage(StorageError::DuplicateKey { .. }) => "23505",
        EngineError::Storage(StorageError::KeyNotFound { .. }) => "02000",
        EngineError::NoRangePartition(_) => "23514",
        other => from_message(&other.to_string()),
    }
}

/// The SQLSTATE of an error known only by its message (DataFusion's, mostly).
fn from_message(message: &str) -> &'static str {
    let m = message.to_ascii_lowercase();
    let has = |s: &str| m.contains(s);
    if has("duplicate primary key") || has("duplicate key") {
        "23505"
    } else if has("savepoint") && has("does not exist") {
        "3B001"
    } else if has("only be used in transaction blocks") {
        "25P01"
    } else if (has("table") || has("view")) && (has("not found") || has("does not exist")) {
        "42P01"
    } else if has("already exists") {
        "42P07"
    } else if has("no field named") || has("column") && has("not found") {
        "42703"
    } else if has("divide by zero") || has("division by zero") {
        "22012"
    } else if has("overflow") || has("out of range") {
        "22003"
    } else if has("cannot be null") || has("null value") || has("not null") {
        "23502"
    } else if has("cast") || has("parse") || has("invalid") && has("value") {
        "22P02"
    } else if has("function") && (has("cannot take") || has("invalid function")) {
        "42883"
    } else {
        "42000"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_clients_act_on_have_their_codes() {
        let duplicate = SqlError::Engine(EngineError::Storage(
            nyala_engine::storage::StorageError::DuplicateKey { key: "(1)".into() },
        ));
        assert_eq!(sqlstate(&duplicate.into()), "23505");
        assert_eq!(sqlstate(&SqlError::Parse("x".into()).into()), "42601");
        let missing = SqlError::DataFusion("table 'nyala.public.nope' not found".into());
        assert_eq!(sqlstate(&missing.into()), "42P01");
        assert_eq!(sqlstate(&SqlError::Conflict("x".into()).into()), "40001");
        assert_eq!(
            sqlstate(&SqlError::PermissionDenied("x".into()).into()),
            "42501"
        );
        assert_eq!(sqlstate(&ServerError::cancelled()), "57014");
    }
}
