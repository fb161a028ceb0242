//! The log entry of an operation: `[timestamp: u64 LE][client request id, if any][operation]`,
//! the request id and the operation in storage's own encodings ([`RequestId::encode_into`],
//! [`TabletOp::encode_into`]). The entry is framed before its timestamp is known and stamped
//! under the in-flight lock, as it is enqueued; what the log holds is decoded without trusting
//! it (a short or damaged entry is a corruption error, not a panic).

use bytes::Bytes;
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

    /// The entry `bytes`; the rows it writes share their memory (see [`TabletOp::decode`]).
    pub(super) fn decode(bytes: &Bytes) -> Result<Self, StorageError> {
        let (ts, op) = bytes.split_first_chunk::<8>().ok_or_else(|| {
            StorageError::Corruption("log entry shorter than its timestamp".into())
        })?;
        let (request, op) = RequestId::split(op)?;
        Ok(Self {
            ts: Timestamp(u64::from_le_bytes(*ts)),
            request,
            op: TabletOp::decode(&bytes.slice(bytes.len() - op.len()..))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use nyala_storage::{ColumnSchema, ColumnType, Schema, WriteBatch, WriteKind};

    use super::*;

    fn commit_entry(request: Option<RequestId>, ts: Timestamp) -> Vec<u8> {
        let op = TabletOp::TxnCommit {
            txn: 7,
            commit_ts: Timestamp(42),
        };
        let mut entry = LoggedOp::frame(&op, request);
        LoggedOp::stamp(&mut entry, ts);
        entry
    }

    /// A framed, stamped entry decodes to its timestamp, request and operation; stamping
    /// again changes the timestamp and nothing else.
    #[test]
    fn an_entry_decodes_to_what_was_framed() {
        let request = RequestId { client: 3, seq: 9 };
        let mut entry = commit_entry(Some(request), Timestamp(1234));
        let logged = LoggedOp::decode(&Bytes::from(entry.clone())).unwrap();
        assert_eq!(logged.ts, Timestamp(1234));
        assert_eq!(logged.request, Some(request));
        assert!(matches!(
            logged.op,
            TabletOp::TxnCommit {
                txn: 7,
                commit_ts: Timestamp(42)
            }
        ));
        LoggedOp::stamp(&mut entry, Timestamp(u64::MAX));
        let restamped = LoggedOp::decode(&Bytes::from(entry.clone())).unwrap();
        assert_eq!(restamped.ts, Timestamp(u64::MAX));
        assert_eq!(restamped.request, Some(request));

        // A write without a request: its rows and kind come back.
        let schema = Schema::new(
            vec![ColumnSchema::new("k", ColumnType::Int64, false)],
            vec![0],
        )
        .unwrap();
        let rows = RecordBatch::try_new(
            schema.arrow_schema(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let write = TabletOp::Write(WriteBatch::new(WriteKind::Upsert, rows.clone()));
        let mut entry = LoggedOp::frame(&write, None);
        LoggedOp::stamp(&mut entry, Timestamp(5));
        let logged = LoggedOp::decode(&Bytes::from(entry.clone())).unwrap();
        assert_eq!((logged.ts, logged.request), (Timestamp(5), None));
        let TabletOp::Write(batch) = logged.op else {
            panic!("not a write: {:?}", logged.op);
        };
        assert_eq!(batch.kind, WriteKind::Upsert);
        assert_eq!(batch.rows, rows);
    }

    /// Every cut-short entry, and one of an unknown write kind, is a corruption error, not a
    /// panic and not some other operation.
    #[test]
    fn damaged_entries_are_corruption() {
        let entry = commit_entry(Some(RequestId { client: 3, seq: 9 }), Timestamp(1234));
        for len in 0..entry.len() {
            match LoggedOp::decode(&Bytes::copy_from_slice(&entry[..len])) {
                Err(StorageError::Corruption(_)) => {}
                Err(e) => panic!("{len} bytes: {e}"),
                Ok(logged) => panic!("{len} bytes decoded as {:?}", logged.op),
            }
        }
        let mut unknown = 1234u64.to_le_bytes().to_vec();
        unknown.push(0x3f);
        assert!(matches!(
            LoggedOp::decode(&Bytes::from(unknown)),
            Err(StorageError::Corruption(_))
        ));
    }
}
