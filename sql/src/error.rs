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
    /// The statement is valid SQL that Nyala does not support yet.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Planning or execution failed inside DataFusion (the message of the innermost error).
    #[error("{0}")]
    DataFusion(String),
    /// The engine (catalog, tablets) rejected or failed an operation.
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("{0}")]
    Engine(#[from] nyala_engine::EngineError),
}

impl From<DataFusionError> for SqlError {
    fn from(e: DataFusionError) -> Self {
        let mut message = e.find_root().strip_backtrace();
        // DataFusion's category prefixes say nothing to a user; the message after them does.
        for prefix in [
            "Execution error: ",
            "External error: ",
            "Arrow error: ",
            "Invalid argument error: ",
        ] {
            while let Some(rest) = message.strip_prefix(prefix) {
                message = rest.to_string();
            }
        }
        SqlError::DataFusion(message)
    }
}

/// sqlparser's message says what was expected, what was found and where.
impl From<datafusion::sql::sqlparser::parser::ParserError> for SqlError {
    fn from(e: datafusion::sql::sqlparser::parser::ParserError) -> Self {
        SqlError::Parse(e.to_string())
    }
}
