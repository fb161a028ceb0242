//! What one client may ask of the server: the size of a request and what a session may hold.
//!
//! No request may exhaust the server, so everything a client sends that the server must hold or
//! work through in proportion to its size is bounded, and checked before that work starts: the
//! statement text before it is parsed, a statement's placeholders once it is planned, an
//! uploaded batch from its message header before arrow-ipc reads it ([`crate::upload`]), the
//! parameter rows of a DoPut as they arrive. A request over a limit is refused with an error
//! that names the limit; a bulk ingest, which streams, is bounded per batch only.
//!
//! What a session keeps between requests is bounded too: prepared statements (closing one makes
//! room) and the plans of queries waiting for DoGet (the oldest are dropped to make room; their
//! tickets still run, planned again).

use tonic::Status;

/// The largest gRPC message the server decodes, hence the largest FlightData (an IPC batch as
/// sent, compressed or not) or statement request.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// The longest statement text, in bytes.
pub const MAX_STATEMENT_BYTES: usize = 1 << 20;

/// The most placeholders (`?`, `$n`) one statement may have (PostgreSQL's limit).
pub const MAX_PARAMETERS: usize = 65_535;

/// The most parameter rows one DoPut may bind; each runs the statement once (bulk ingest is
/// the way to load more rows).
pub const MAX_PARAMETER_ROWS: usize = 10_000;

/// The most bytes of parameter values (decoded) one DoPut may bind.
pub const MAX_PARAMETER_BYTES: usize = 16 << 20;

/// The most rows of one uploaded batch (bulk ingest or parameters), also of each nested array
/// in it. Bounds the work of batches whose columns take no bytes per row (NULL columns).
pub const MAX_BATCH_ROWS: usize = 1 << 24;

/// The most bytes of one uploaded batch once decompressed (also of one dictionary, with its
/// deltas).
pub const MAX_BATCH_BYTES: usize = MAX_MESSAGE_BYTES;

/// The most prepared statements one session may hold open.
pub const MAX_PREPARED_STATEMENTS: usize = 1024;

/// The most queries planned by GetFlightInfo and not yet fetched that a session keeps, and the
/// most plans they may hold together (a query has one per parameter row). The oldest are
/// dropped to make room; a query with more plans than that is not kept.
pub const MAX_PENDING_QUERIES: usize = 256;
pub const MAX_PENDING_PLANS: usize = 1024;

/// `sql` if it is within [`MAX_STATEMENT_BYTES`].
pub fn statement_text(sql: &str) -> Result<&str, Status> {
    match sql.len() {
        n if n > MAX_STATEMENT_BYTES => Err(Status::invalid_argument(format!(
            "the statement is {n} bytes long; at most {MAX_STATEMENT_BYTES} are allowed"
        ))),
        _ => Ok(sql),
    }
}

/// Refuses a statement with more than [`MAX_PARAMETERS`] placeholders.
pub fn parameter_count(count: usize) -> Result<(), Status> {
    match count {
        n if n > MAX_PARAMETERS => Err(Status::invalid_argument(format!(
            "the statement has {n} parameters; at most {MAX_PARAMETERS} are allowed"
        ))),
        _ => Ok(()),
    }
}

/// Refuses parameter rows beyond [`MAX_PARAMETER_ROWS`] or [`MAX_PARAMETER_BYTES`] (counted as
/// they arrive, so an upload stops at the batch that crosses a limit).
pub fn parameter_rows(rows: usize, bytes: usize) -> Result<(), Status> {
    if rows > MAX_PARAMETER_ROWS {
        return Err(Status::invalid_argument(format!(
            "{rows} or more parameter rows were bound; at most {MAX_PARAMETER_ROWS} are allowed \
             at a time (bulk ingest loads more)"
        )));
    }
    if bytes > MAX_PARAMETER_BYTES {
        return Err(Status::invalid_argument(format!(
            "{bytes} or more bytes of parameter values were bound; at most \
             {MAX_PARAMETER_BYTES} are allowed at a time"
        )));
    }
    Ok(())
}
