//! What one client may ask of the session layer, whatever its protocol: the size of a
//! statement and what a session may hold. A request over a limit is refused with an error that
//! names the limit, before the work it would cause starts. (What a Flight SQL upload may hold
//! is bounded in the Flight server, where uploads are decoded.)
//!
//! What a session keeps between requests is bounded: prepared statements (closing one makes
//! room) and the plans of queries waiting to be fetched (the oldest are dropped to make room;
//! their tickets still run, planned again).

use crate::error::{Result, ServerError};

/// The longest statement text, in bytes.
pub const MAX_STATEMENT_BYTES: usize = 1 << 20;

/// The most placeholders (`?`, `$n`) one statement may have (PostgreSQL's limit).
pub const MAX_PARAMETERS: usize = 65_535;

/// The most prepared statements one session may hold open.
pub const MAX_PREPARED_STATEMENTS: usize = 1024;

/// The most queries planned and not yet fetched that a session keeps, and the most plans they
/// may hold together (a query has one per parameter row). The oldest are dropped to make room;
/// a query with more plans than that is not kept.
pub const MAX_PENDING_QUERIES: usize = 256;
pub const MAX_PENDING_PLANS: usize = 1024;

/// `sql` if it is within [`MAX_STATEMENT_BYTES`].
pub fn statement_text(sql: &str) -> Result<&str> {
    match sql.len() {
        n if n > MAX_STATEMENT_BYTES => Err(ServerError::TooLarge(format!(
            "the statement is {n} bytes long; at most {MAX_STATEMENT_BYTES} are allowed"
        ))),
        _ => Ok(sql),
    }
}

/// Refuses a statement with more than [`MAX_PARAMETERS`] placeholders.
pub fn parameter_count(count: usize) -> Result<()> {
    match count {
        n if n > MAX_PARAMETERS => Err(ServerError::TooLarge(format!(
            "the statement has {n} parameters; at most {MAX_PARAMETERS} are allowed"
        ))),
        _ => Ok(()),
    }
}
