//! Write batches: the unit a tablet applies atomically and the payload of a Raft log entry
//! (one kind byte followed by the rows as an Arrow IPC stream).
//!
//! A batch decoded from an entry keeps its rows where the entry has them: the columns are
//! slices of the entry's bytes, not copies (the MemRowSet's arena then holds the entry). Arrow
//! reads a column in place only where it is aligned for its type (16 bytes for decimals), so
//! the rows start 16-aligned within the entry ([`ROWS_ALIGNMENT`]) and the stream keeps its
//! buffers 64-aligned: an entry in memory aligned as allocators align any allocation is read
//! without a copy (on a leader, its own proposal; on a restart, what the log held). Bytes
//! from elsewhere (a network message) are read with copies of what is not aligned.

use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::StorageError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// HybridTime layout: physical microseconds since the Unix epoch above 12 logical bits.
    pub const LOGICAL_BITS: u32 = 12;

    pub fn from_micros(micros: u64) -> Self {
        Timestamp(micros << Self::LOGICAL_BITS)
    }

    pub fn micros(self) -> u64 {
        self.0 >> Self::LOGICAL_BITS
    }

    /// The last timestamp of the microsecond this one is in.
    pub fn end_of_microsecond(self) -> Timestamp {
        Timestamp(self.0 | ((1 << Self::LOGICAL_BITS) - 1))
    }

    /// The wall time of the timestamp, for messages.
    pub fn display(self) -> String {
        arrow::temporal_conversions::timestamp_us_to_datetime(self.micros() as i64)
            .map(|t| format!("{} UTC", t.format("%Y-%m-%d %H:%M:%S%.6f")))
            .unwrap_or_else(|| format!("hybrid time {}", self.0))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Hash, Serialize, Deserialize)]
pub enum WriteKind {
    /// New rows; an existing key is an error.
    Insert = 0,
    /// Insert or replace whole rows.
    Upsert,
    /// Key columns plus the columns to change; a missing key is an error.
    Update,
    /// Key columns; a missing key is an error.
    Delete = 3,
    /// New rows; rows whose key exists (or repeats in the batch) are skipped.
    InsertIgnore = 4,
}

/// What a tablet's log entry holds after its timestamp: a write, a schema change, or a step of
/// a transaction (each a tag byte no write kind uses, then its fields).
#[derive(Clone, Debug)]
pub enum TabletOp {
    Write(WriteBatch),
    AlterSchema(crate::Schema),
    /// A write of transaction `txn`, kept aside until it commits; with `prepare`, its last one
    /// here, which also prepares it (as a [`TabletOp::TxnPrepare`] after it would).
    TxnWrite {
        txn: u64,
        batch: WriteBatch,
        prepare: bool,
    },
    /// Transaction `txn` is committing, at a timestamp at least this entry's.
    TxnPrepare {
        txn: u64,
    },
    /// Transaction `txn` is no longer prepared here (its coordinator let go, to prepare again
    /// later).
    TxnUnprepare {
        txn: u64,
    },
    /// Transaction `txn` commits at `commit_ts`.
    TxnCommit {
        txn: u64,
        commit_ts: Timestamp,
    },
    TxnAbort {
        txn: u64,
    },
    /// Copy the tablet's committed rows, as of this entry or as of `as_of`, into a new tablet
    /// `target` (a table clone; see [`crate::Tablet::make_clone`]).
    Clone {
        target: String,
        as_of: Option<Timestamp>,
    },
}

const ALTER_SCHEMA: u8 = 0x80;
const TXN_WRITE: u8 = 0x81;
const TXN_PREPARE: u8 = 0x82;
const TXN_COMMIT: u8 = 0x83;
const TXN_ABORT: u8 = 0x84;
const CLONE: u8 = 0x85;
const TXN_UNPREPARE: u8 = 0x86;
const TXN_WRITE_PREPARE: u8 = 0x87;
/// Before an op in a log entry: the client's request it applies (see [`crate::RequestId`]).
pub(crate) const REQUEST: u8 = 0x88;

/// A transaction entry's id and the bytes after it.
fn txn(rest: &[u8]) -> Result<(u64, &[u8]), StorageError> {
    let (txn, rest) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| StorageError::Corruption("transaction entry shorter than its id".into()))?;
    Ok((u64::from_le_bytes(*txn), rest))
}

impl TabletOp {
    /// Appends the op's log entry to `out` (a write's rows go straight in, not through a
    /// buffer of their own).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let tagged = |out: &mut Vec<u8>, tag: u8, txn: u64| {
            out.push(tag);
            out.extend_from_slice(&txn.to_le_bytes());
        };
        match self {
            TabletOp::Write(batch) => batch.encode_into(out),
            TabletOp::AlterSchema(schema) => {
                out.push(ALTER_SCHEMA);
                // A schema is plain data: serialising it cannot fail.
                out.extend(serde_json::to_vec(schema).unwrap_or_default());
            }
            TabletOp::TxnWrite {
                txn,
                batch,
                prepare,
            } => {
                let tag = match prepare {
                    true => TXN_WRITE_PREPARE,
                    false => TXN_WRITE,
                };
                tagged(out, tag, *txn);
                batch.encode_into(out);
            }
            TabletOp::TxnPrepare { txn } => tagged(out, TXN_PREPARE, *txn),
            TabletOp::TxnUnprepare { txn } => tagged(out, TXN_UNPREPARE, *txn),
            TabletOp::TxnCommit { txn, commit_ts } => {
                tagged(out, TXN_COMMIT, *txn);
                out.extend_from_slice(&commit_ts.0.to_le_bytes());
            }
            TabletOp::TxnAbort { txn } => tagged(out, TXN_ABORT, *txn),
            TabletOp::Clone { target, as_of } => {
                // 0: as of the entry itself (timestamp 0 is never a snapshot to clone at).
                tagged(out, CLONE, as_of.map_or(0, |t| t.0));
                out.extend_from_slice(target.as_bytes());
            }
        }
    }

    /// The op of a log entry's bytes (see [`WriteBatch::decode`] for its rows).
    pub fn decode(bytes: &Bytes) -> Result<TabletOp, StorageError> {
        match bytes.split_first() {
            Some((&ALTER_SCHEMA, json)) => serde_json::from_slice(json)
                .map(TabletOp::AlterSchema)
                .map_err(|e| StorageError::Corruption(format!("schema change entry: {e}"))),
            Some((&(tag @ TXN_WRITE | tag @ TXN_WRITE_PREPARE), rest)) => {
                let (txn, rest) = txn(rest)?;
                let batch = WriteBatch::decode(&tail(bytes, rest))?;
                Ok(TabletOp::TxnWrite {
                    txn,
                    batch,
                    prepare: tag == TXN_WRITE_PREPARE,
                })
            }
            Some((&TXN_PREPARE, rest)) => Ok(TabletOp::TxnPrepare { txn: txn(rest)?.0 }),
            Some((&TXN_UNPREPARE, rest)) => Ok(TabletOp::TxnUnprepare { txn: txn(rest)?.0 }),
            Some((&TXN_COMMIT, rest)) => {
                let (txn, rest) = txn(rest)?;
                let ts = rest.first_chunk::<8>().ok_or_else(|| {
                    StorageError::Corruption("commit entry without its timestamp".into())
                })?;
                Ok(TabletOp::TxnCommit {
                    txn,
                    commit_ts: Timestamp(u64::from_le_bytes(*ts)),
                })
            }
            Some((&TXN_ABORT, rest)) => Ok(TabletOp::TxnAbort { txn: txn(rest)?.0 }),
            Some((&CLONE, rest)) => {
                let (as_of, target) = rest.split_first_chunk::<8>().ok_or_else(|| {
                    StorageError::Corruption("clone entry shorter than its time".into())
                })?;
                let as_of = u64::from_le_bytes(*as_of);
                let target = std::str::from_utf8(target).map_err(|_| {
                    StorageError::Corruption("clone entry: target not UTF-8".into())
                })?;
                Ok(TabletOp::Clone {
                    target: target.to_string(),
                    as_of: (as_of != 0).then_some(Timestamp(as_of)),
                })
            }
            _ => WriteBatch::decode(bytes).map(TabletOp::Write),
        }
    }
}

/// `rest`, a slice of `bytes`, as a slice of `bytes` that shares its memory.
fn tail(bytes: &Bytes, rest: &[u8]) -> Bytes {
    bytes.slice(bytes.len() - rest.len()..)
}

/// Write-kind byte flag: an 8-byte `unchanged_since` timestamp follows the kind byte.
const CONDITIONAL: u8 = 0x40;
/// Write-kind byte flag: the 8 bytes of [`AutoIds`] follow (after the timestamp, if any).
const AUTO_IDS: u8 = 0x20;
/// Write-kind byte flag: after the other fields, a byte `n` and `n` bytes of padding, which
/// start the rows at a multiple of [`ROWS_ALIGNMENT`] in what they are encoded into.
const PADDED: u8 = 0x10;
/// Where in an encoding the rows start: a multiple of this (see the module's comment).
const ROWS_ALIGNMENT: usize = 16;

/// Which auto_incrementing_ids the rows a batch inserts take, in a table keyed by that column
/// alone (a table without a declared key), whose hash level places an id in bucket `id %
/// modulus`: those of the batch's tablet, `id % modulus == residue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoIds {
    pub residue: u32,
    pub modulus: u32,
}

impl AutoIds {
    /// The first id at or after `next` this batch may take.
    pub fn first_at_or_after(&self, next: i64) -> i64 {
        let modulus = i64::from(self.modulus.max(1));
        let offset = (i64::from(self.residue) - next).rem_euclid(modulus);
        next + offset
    }
}

/// Rows a tablet applies atomically, with what they mean ([`WriteKind`]).
#[derive(Clone, Debug)]
pub struct WriteBatch {
    pub kind: WriteKind,
    pub rows: RecordBatch,
    /// For UPDATE and DELETE: the snapshot the rows were read at. If a row's key changed after
    /// it (a newer version, or deleted), nothing is applied and the row is reported as a
    /// conflict, so the statement can read its rows again: no update is lost to a concurrent
    /// one.
    pub unchanged_since: Option<crate::Timestamp>,
    /// For inserts into a table without a declared key: the ids its tablet gives out.
    pub auto_ids: Option<AutoIds>,
}

/// What applying a [`WriteBatch`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteOutcome {
    /// Rows applied.
    pub rows: usize,
    /// Rows (indices into the batch) whose key changed after the batch's `unchanged_since`
    /// (then no row was applied).
    pub conflicts: Vec<u32>,
    /// The timestamp the applied rows are visible from (set by the replica that applied them).
    pub visible_at: Option<Timestamp>,
}

impl WriteBatch {
    pub fn new(kind: WriteKind, rows: RecordBatch) -> Self {
        Self {
            kind,
            rows,
            unchanged_since: None,
            auto_ids: None,
        }
    }

    /// The batch, applied only to rows unchanged since `snapshot` (see `unchanged_since`).
    pub fn unchanged_since(mut self, snapshot: Timestamp) -> Self {
        self.unchanged_since = Some(snapshot);
        self
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// Appends the batch's encoding to `out`, which grows once: by the rows' size and room
    /// for the IPC stream's framing.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(9 + rows_bytes(&self.rows) + 256 * (self.rows.num_columns() + 2));
        let mut tag = self.kind as u8;
        if self.unchanged_since.is_some() {
            tag |= CONDITIONAL;
        }
        if self.auto_ids.is_some() {
            tag |= AUTO_IDS;
        }
        out.push(tag | PADDED);
        if let Some(ts) = self.unchanged_since {
            out.extend_from_slice(&ts.0.to_le_bytes());
        }
        if let Some(ids) = self.auto_ids {
            out.extend_from_slice(&ids.residue.to_le_bytes());
            out.extend_from_slice(&ids.modulus.to_le_bytes());
        }
        let padding = (ROWS_ALIGNMENT - (out.len() + 1) % ROWS_ALIGNMENT) % ROWS_ALIGNMENT;
        out.push(padding as u8);
        out.resize(out.len() + padding, 0);
        let header = out.len();
        // Writing to a Vec only fails for batches that don't match their own schema, which a
        // RecordBatch cannot be; an empty payload then decodes as an error, never as data.
        let ok = (|| -> Result<(), arrow::error::ArrowError> {
            let mut writer = StreamWriter::try_new(&mut *out, &self.rows.schema())?;
            writer.write(&self.rows)?;
            writer.finish()
        })();
        if ok.is_err() {
            out.truncate(header);
        }
    }

    /// The batch encoded in `bytes`; its rows are slices of `bytes` where aligned (see the
    /// module's comment).
    pub fn decode(bytes: &Bytes) -> Result<WriteBatch, StorageError> {
        let (&tag, mut payload) = bytes
            .split_first()
            .ok_or_else(|| StorageError::Corruption("empty write batch".into()))?;
        let unchanged_since = match tag & CONDITIONAL {
            0 => None,
            _ => {
                let (ts, rest) = payload.split_first_chunk::<8>().ok_or_else(|| {
                    StorageError::Corruption("write batch shorter than its snapshot".into())
                })?;
                payload = rest;
                Some(Timestamp(u64::from_le_bytes(*ts)))
            }
        };
        let auto_ids = match tag & AUTO_IDS {
            0 => None,
            _ => {
                let (ids, rest) = payload.split_first_chunk::<8>().ok_or_else(|| {
                    StorageError::Corruption("write batch shorter than its auto ids".into())
                })?;
                payload = rest;
                let (residue, modulus) = ids.split_at(4);
                let word = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or_default());
                Some(AutoIds {
                    residue: word(residue),
                    modulus: word(modulus),
                })
            }
        };
        if tag & PADDED != 0 {
            let (&padding, rest) = payload.split_first().ok_or_else(|| {
                StorageError::Corruption("write batch shorter than its padding".into())
            })?;
            payload = rest.get(padding as usize..).ok_or_else(|| {
                StorageError::Corruption("write batch shorter than its padding".into())
            })?;
        }
        let kind = match tag & !(CONDITIONAL | AUTO_IDS | PADDED) {
            0 => WriteKind::Insert,
            1 => WriteKind::Upsert,
            2 => WriteKind::Update,
            3 => WriteKind::Delete,
            4 => WriteKind::InsertIgnore,
            other => {
                return Err(StorageError::Corruption(format!(
                    "unknown write kind {other}"
                )))
            }
        };
        let rows = decode_rows(tail(bytes, payload))?;
        Ok(WriteBatch {
            kind,
            rows,
            unchanged_since,
            auto_ids,
        })
    }
}

/// The first batch of the Arrow IPC stream in `stream`, its columns slices of `stream` where
/// aligned. Under [`crate::panics::catch_quietly`]: arrow's decoder panics on some malformed
/// messages, and damaged bytes must be an error.
fn decode_rows(stream: Bytes) -> Result<RecordBatch, StorageError> {
    let mut stream = Buffer::from(stream);
    let decoded = crate::panics::catch_quietly(|| StreamDecoder::new().decode(&mut stream));
    match decoded {
        Ok(Ok(Some(rows))) => Ok(rows),
        Ok(Ok(None)) => Err(StorageError::Corruption("write batch without rows".into())),
        Ok(Err(e)) => Err(e.into()),
        Err(panic) => Err(StorageError::Corruption(format!(
            "write batch cannot be read: {}",
            crate::panics::panic_message(panic.as_ref())
        ))),
    }
}

/// The bytes of the values `rows` holds. Unlike `RecordBatch::get_array_memory_size`, which
/// counts every buffer an array points into in full, this counts each array's slice once: the
/// columns of a decoded Arrow IPC message all point into one buffer, which that method counts
/// once per column.
pub fn rows_bytes(rows: &RecordBatch) -> usize {
    (rows.columns().iter())
        .map(|c| {
            (c.to_data().get_slice_memory_size()).unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, Decimal128Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn rows() -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("d", DataType::Decimal128(15, 2), true),
            Field::new("s", DataType::Utf8, true),
        ]);
        let n = 1000;
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(
                    Decimal128Array::from_iter((0..n).map(|i| (i % 3 != 0).then_some(i as i128)))
                        .with_precision_and_scale(15, 2)
                        .unwrap(),
                ),
                Arc::new(StringArray::from_iter(
                    (0..n).map(|i| (i % 5 != 0).then(|| format!("row {i}"))),
                )),
            ],
        )
        .unwrap()
    }

    fn batches() -> Vec<WriteBatch> {
        let plain = WriteBatch::new(WriteKind::Insert, rows());
        let conditional = WriteBatch::new(WriteKind::Update, rows()).unchanged_since(Timestamp(7));
        let mut ids = WriteBatch::new(WriteKind::InsertIgnore, rows());
        ids.auto_ids = Some(AutoIds {
            residue: 2,
            modulus: 5,
        });
        vec![plain, conditional, ids]
    }

    /// Whatever comes before a batch in what it is encoded into (a log entry's timestamp and
    /// request), it decodes to what was encoded, its columns read in place: slices of the
    /// encoding's memory, not copies.
    #[test]
    fn a_decoded_batch_reads_its_rows_in_place() {
        for batch in batches() {
            for before in 0..40 {
                let mut out = vec![0xAB; before];
                batch.encode_into(&mut out);
                let bytes = Bytes::from(out);
                let decoded = WriteBatch::decode(&bytes.slice(before..)).unwrap();
                assert_eq!(decoded.kind, batch.kind);
                assert_eq!(decoded.unchanged_since, batch.unchanged_since);
                assert_eq!(decoded.auto_ids, batch.auto_ids);
                assert_eq!(decoded.rows, batch.rows);
                let within = bytes.as_ptr_range();
                for column in decoded.rows.columns() {
                    for buffer in column.to_data().buffers() {
                        assert!(
                            within.contains(&buffer.as_ptr()),
                            "{} after {before} bytes: a column was copied",
                            column.data_type()
                        );
                    }
                }
            }
        }
    }

    /// A batch encoded before rows were padded (no PADDED flag) still decodes.
    #[test]
    fn an_unpadded_batch_decodes() {
        let rows = rows();
        let mut out = vec![WriteKind::Upsert as u8];
        let mut writer = StreamWriter::try_new(&mut out, &rows.schema()).unwrap();
        writer.write(&rows).unwrap();
        writer.finish().unwrap();
        drop(writer);
        let decoded = WriteBatch::decode(&Bytes::from(out)).unwrap();
        assert_eq!(decoded.kind, WriteKind::Upsert);
        assert_eq!(decoded.rows, rows);
    }

    /// Every encoding cut short before the end of its rows is an error; every one with a byte
    /// changed is an error or some batch: never a panic.
    #[test]
    fn damaged_batches_are_errors() {
        let mut small = WriteBatch::new(WriteKind::Upsert, rows().slice(0, 3));
        small.unchanged_since = Some(Timestamp(9));
        let encoded = small.encode();
        // (The stream's last 8 bytes say that it ends, after the rows.)
        for len in 0..encoded.len() - 8 {
            assert!(WriteBatch::decode(&Bytes::copy_from_slice(&encoded[..len])).is_err());
        }
        for at in 0..encoded.len() {
            for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut damaged = encoded.clone();
                damaged[at] = value;
                let _ = WriteBatch::decode(&Bytes::from(damaged));
            }
        }
    }
}
