//! Errors of the SQL layer: what a client sees when a statement is rejected.

use datafusion::error::DataFusionError;

#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// The statement could not be parsed.
    #[error("syntax error: {0}")]
    Parse(String),
    /// The statement is well-formed but not valid here (unknown table, wrong types, ...).
    #[error("{0}")]
    Invalid(String),
    /// The session's user lacks a privilege the statement needs.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The statement met a row another transaction changed; running it again (its whole
    /// transaction) may succeed.
    #[error("{0}")]
    Conflict(String),
    /// The statement is valid SQL that Nyala does not support yet.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Planning or execution failed inside DataFusion (the message of the innermost error).
    #[error("{0}")]
    DataFusion(String),
    /// The statement reached a limit of what one statement may use (its memory, its time).
    #[error("{0}")]
    Exhausted(String),
    /// The statement was stopped before it changed anything: cancelled, or its client went
    /// away.
    #[error("{0}")]
    Cancelled(String),
    /// The engine (catalog, tablets) rejected or failed an operation.
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("{0}")]
    Engine(#[from] nyala_engine::EngineError),
}

impl From<DataFusionError> for SqlError {
    fn from(e: DataFusionError) -> Self {
        if let DataFusionError::External(inner) = e.find_root() {
            match inner.downcast_ref::<SqlError>() {
                Some(SqlError::Conflict(message)) => return SqlError::Conflict(message.clone()),
                Some(SqlError::Cancelled(message)) => return SqlError::Cancelled(message.clone()),
                Some(SqlError::Engine(nyala_engine::EngineError::OutcomeUnknown(message))) => {
                    let unknown = nyala_engine::EngineError::OutcomeUnknown(message.clone());
                    return SqlError::Engine(unknown);
                }
                _ => {}
            }
            if let Some(e) = transient(inner.as_ref()) {
                return SqlError::Engine(e);
            }
        }
        let root = e.find_root();
        let message = strip_categories(&root.strip_backtrace());
        if let DataFusionError::ResourcesExhausted(_) = root {
            return SqlError::Exhausted(message);
        }
        SqlError::DataFusion(signature_mismatch(&message).unwrap_or(message))
    }
}

/// A busy or unreachable tablet behind `error` (retryable, unlike the statement's own
/// mistakes), also when a remote scan reported it as its iterator's I/O error.
fn transient(error: &(dyn std::error::Error + 'static)) -> Option<nyala_engine::EngineError> {
    use nyala_engine::EngineError;
    let engine = match error.downcast_ref::<nyala_storage::StorageError>() {
        Some(nyala_storage::StorageError::Io(io)) => io.get_ref()?.downcast_ref::<EngineError>(),
        _ => error.downcast_ref::<EngineError>(),
    };
    // A worker of a distributed query that could not be reached (see `distributed::workers`).
    if let Some(status) = error.downcast_ref::<tonic::Status>() {
        return (status.code() == tonic::Code::Unavailable)
            .then(|| EngineError::Unavailable(status.message().to_string()));
    }
    match engine? {
        EngineError::Busy(message) => Some(EngineError::Busy(message.clone())),
        EngineError::Unavailable(message) => Some(EngineError::Unavailable(message.clone())),
        _ => None,
    }
}

/// DataFusion's category prefixes ("Error during planning: Internal error: ...") say nothing to
/// a user, and "Internal error" is wrong for their mistakes; the message after them is what
/// went wrong. So is the request to file a bug DataFusion appends to its internal errors.
fn strip_categories(message: &str) -> String {
    const PREFIXES: [&str; 7] = [
        "Error during planning: ",
        "Resources exhausted: ",
        "Internal error: ",
        "Execution error: ",
        "External error: ",
        "Arrow error: ",
        "Invalid argument error: ",
    ];
    let mut message = message.trim();
    while let Some(rest) = PREFIXES.iter().find_map(|p| message.strip_prefix(p)) {
        message = rest.trim_start();
    }
    let message = match message.find(". This issue was likely caused by a bug") {
        Some(end) => &message[..end],
        None => message,
    };
    message.to_string()
}

/// "Function 'sum' failed to match any signature, errors: ..." (an internal error, for `sum` of
/// a string column): the function and the argument types it was given, and the first reason.
fn signature_mismatch(message: &str) -> Option<String> {
    let rest = message.strip_prefix("Function '")?;
    let (name, rest) = rest.split_once('\'')?;
    let reasons = rest.strip_prefix(" failed to match any signature, errors: ")?;
    let mut types: Vec<&str> = Vec::new();
    for received in reasons.split("(DataType: ").skip(1) {
        let Some((data_type, _)) = received.split_once(')') else {
            continue;
        };
        if !types.contains(&data_type) {
            types.push(data_type);
        }
    }
    let first = reasons.split(",Error during planning: ").next()?;
    let first = strip_categories(first);
    let first = first.trim_end_matches('.');
    Some(match types.is_empty() {
        true => format!("function {name} cannot take these arguments: {first}"),
        false => format!(
            "function {name} cannot take arguments of type {}: {first}",
            types.join(", ")
        ),
    })
}

/// sqlparser's message says what was expected, what was found and where.
impl From<datafusion::sql::sqlparser::parser::ParserError> for SqlError {
    fn from(e: datafusion::sql::sqlparser::parser::ParserError) -> Self {
        SqlError::Parse(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tablet that stayed busy during a remote scan is reported as busy (UNAVAILABLE to
    /// Flight SQL clients, retryable), not as the statement's mistake.
    #[test]
    fn a_busy_tablet_behind_a_scan_stays_busy() {
        use nyala_engine::EngineError;
        let busy =
            EngineError::Busy("tablet t: writes below snapshot 1 are still being applied".into());
        let scan = nyala_storage::StorageError::Io(std::io::Error::other(busy));
        let e = DataFusionError::Context(
            "scan".into(),
            Box::new(DataFusionError::External(Box::new(scan))),
        );
        match SqlError::from(e) {
            SqlError::Engine(EngineError::Busy(message)) => {
                assert!(message.contains("still being applied"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        let gone = DataFusionError::External(Box::new(EngineError::Unavailable("down".into())));
        assert!(matches!(
            SqlError::from(gone),
            SqlError::Engine(EngineError::Unavailable(_))
        ));
    }

    #[test]
    fn internal_errors_of_ordinary_mistakes_become_user_errors() {
        let e = DataFusionError::Plan(
            "Internal error: Function 'sum' failed to match any signature, errors: Error \
             during planning: Function 'sum' requires Decimal, but received String \
             (DataType: Utf8).,Error during planning: Function 'sum' requires Int64, but \
             received String (DataType: Utf8).. This issue was likely caused by a bug in \
             DataFusion's code. Please help us to resolve this by filing a bug report"
                .into(),
        );
        assert_eq!(
            SqlError::from(e).to_string(),
            "function sum cannot take arguments of type Utf8: Function 'sum' requires \
             Decimal, but received String (DataType: Utf8)"
        );
        let e = DataFusionError::Execution("Arrow error: Divide by zero error".into());
        assert_eq!(SqlError::from(e).to_string(), "Divide by zero error");
    }
}
