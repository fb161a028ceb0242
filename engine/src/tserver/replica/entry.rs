//! The log entry of an operation: `[timestamp: u64 LE][client request id, if any][operation]`,
//! the request id and the operation in storage's own encodings ([`RequestId::encode_into`],
//! [`TabletOp::encode_into`]). The entry is framed before its timestamp is known and stamped
//! under the in-flight lock, as it is enqueued; what the log holds is decoded without trusting
//! it (a short or damaged entry is a corruption error, not a panic).

use nyala_storage::{RequestId, StorageError, TabletOp, Timestamp};

/// An operation as it is stored in the Raft log: its timestamp, the client's request it
/// applies (if the client tracks it), then the operation.
pub(super) struct LoggedOp {
    pub(super) ts: Timestamp,
    pub(super) request: Option<RequestId>,
    pub(super) op: TabletOp,
}

impl LoggedOp {
    /// The log entry of `op`, its timestamp left to [`LoggedOp::stamp`].
    pub(super) fn frame(op: &TabletOp, request: Option<RequestId>) -> Vec<u8> {
        let mut entry = vec![0; 8];
        if let Some(request) = request {
            request.encode_into(&mut entry);
        }
        op.encode_into(&mut entry);
        entry
    }

    pub(super) fn stamp(entry: &mut [u8], ts: Timestamp) {
        entry[..8].copy_from_slice(&ts.0.to_le_bytes());
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Self, StorageError> {
        let (ts, op) = bytes.split_first_chunk::<8>().ok_or_else(|| {
            StorageError::Corruption("log entry shorter than its timestamp".into())
        })?;
        let (request, op) = RequestId::split(op)?;
        Ok(Self {
            ts: Timestamp(u64::from_le_bytes(*ts)),
            request,
            op: TabletOp::decode(op)?,
        })
    }
}
