//! What one Flight SQL request may upload: its size, its batches, its parameter rows.
//!
//! No request may exhaust the server, so everything a client sends that the server must hold or
//! work through in proportion to its size is bounded, and checked before that work starts: an
//! uploaded batch from its message header before arrow-ipc reads it ([`crate::upload`]), the
//! parameter rows of a DoPut as they arrive. A request over a limit is refused with an error
//! that names the limit; a bulk ingest, which streams, is bounded per batch only. The limits
//! of every protocol (statement text, placeholders, what a session holds) are the session
//! layer's ([`nyala_server::limits`]).

use tonic::Status;

/// The largest gRPC message the server decodes, hence the largest FlightData (an IPC batch as
/// sent, compressed or not) or statement request.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

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
