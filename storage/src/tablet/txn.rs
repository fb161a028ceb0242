//! One tablet's part of a transaction (Kudu's multi-row transactions, KUDU-2612).
//!
//! A transaction's writes arrive through the log like any write and are checked the same way,
//! against the tablet and the transaction's own earlier writes, but they are kept aside and
//! their keys locked: the rows become visible only when the commit applies them all at the
//! transaction's commit timestamp; an abort drops them. Another write to a locked key fails
//! with [`StorageError::Locked`] (a conditional UPDATE or DELETE outside a transaction reports
//! the row as a conflict instead and reads it again later). Prepare marks the transaction as
//! committing: it takes no more writes, and its prepare timestamp bounds the commit timestamp
//! from below (the replica holds back snapshots at and above it until the commit or abort).
//!
//! Pending transactions survive flushes: a flush that makes entries of a pending transaction
//! durable writes the transaction's writes to a file the metadata names (`txns-<id>`), read
//! back on open. Every step is deterministic, so replicas and replays agree.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use super::write::{queue_write, with_positions, QueueWrite};
use super::{State, Tablet};
use crate::key::{encode_keys, format_key};
use crate::{StorageError, Timestamp, WriteBatch, WriteKind, WriteOutcome};

/// A transaction's writes in this tablet, not yet committed or aborted.
#[derive(Clone)]
pub(super) struct PendingTxn {
    /// The writes, checked and in order, as the commit applies them.
    writes: Vec<WriteBatch>,
    /// Whether each key the transaction wrote exists after its writes.
    present: HashMap<Vec<u8>, bool>,
    /// The prepare timestamp, once prepared.
    prepared: Option<Timestamp>,
    /// The timestamp of its latest write here.
    last_write: Timestamp,
}

impl PendingTxn {
    fn new(ts: Timestamp) -> Self {
        PendingTxn {
            writes: Vec::new(),
            present: HashMap::new(),
            prepared: None,
            last_write: ts,
        }
    }

    /// Whether it is committing and inserts rows here (in a queue table, they take positions
    /// at the commit).
    pub(super) fn commits_inserts(&self) -> bool {
        self.prepared.is_some() && self.inserts()
    }

    /// Whether it inserts rows here.
    fn inserts(&self) -> bool {
        (self.writes.iter()).any(|w| matches!(w.kind, WriteKind::Insert | WriteKind::InsertIgnore))
    }
}

/// Pending transactions and the keys they locked.
pub(super) type Pending = (BTreeMap<u64, PendingTxn>, HashMap<Vec<u8>, u64>);

/// A pending transaction as others see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnState {
    pub txn: u64,
    /// Its latest write here.
    pub last_write: Timestamp,
    pub prepared: Option<Timestamp>,
}

impl Tablet {
    /// Applies log entry `index` at `ts`: a write of transaction `txn`, checked now and kept
    /// aside until the transaction commits. Rows of a conditional batch changed since its
    /// snapshot are reported as conflicts, and then nothing is kept.
    pub fn apply_txn_write(
        &self,
        index: u64,
        ts: Timestamp,
        txn: u64,
        batch: &WriteBatch,
    ) -> Result<WriteOutcome, StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        let schema = state.schema.clone();
        if state.txns.get(&txn).is_some_and(|t| t.prepared.is_some()) {
            return Err(StorageError::TxnState(format!(
                "transaction {txn} is committing and takes no more writes"
            )));
        }
        if let QueueWrite::Insert = queue_write(&schema, batch.kind)? {
            // New rows of a queue table collide with nothing and lock nothing: they wait here
            // with positions only held in place, and take theirs when the commit applies them.
            let rows = with_positions(&schema, &batch.rows, 0, 0, true)?;
            let rows = Self::conform(&schema, &WriteBatch::new(WriteKind::Insert, rows))?;
            let n = rows.num_rows();
            let pending = state.txns.entry(txn).or_insert_with(|| PendingTxn::new(ts));
            pending.last_write = ts;
            if n > 0 {
                pending
                    .writes
                    .push(WriteBatch::new(WriteKind::Insert, rows));
            }
            return Ok(WriteOutcome {
                rows: n,
                conflicts: Vec::new(),
                visible_at: None,
            });
        }
        let rows = Self::conform(&schema, batch)?;
        let keys = encode_keys(&schema, &rows)?;
        let own = state.txns.get(&txn);
        // An UPSERT in a transaction with a snapshot overwrites only rows unchanged since it
        // (snapshot isolation: the first writer wins); INSERT checks for the key anyway.
        let conditional = match batch.kind {
            WriteKind::Update | WriteKind::Delete | WriteKind::Upsert => batch.unchanged_since,
            WriteKind::Insert | WriteKind::InsertIgnore => None,
        };
        let mut keep = vec![true; rows.num_rows()];
        let mut conflicts = Vec::new();
        for (row, key) in keys.iter().enumerate() {
            if state.locks.get(key).is_some_and(|&owner| owner != txn) {
                return Err(StorageError::Locked {
                    key: format_key(&schema, &rows, row),
                });
            }
            let written_here = own.is_some_and(|t| t.present.contains_key(key));
            if let Some(snapshot) = conditional {
                let changed = match batch.kind {
                    // An UPSERT may write a row that does not exist.
                    WriteKind::Upsert => {
                        state.written_after(key, snapshot, &self.options.page_cache)?
                    }
                    _ => state.changed_after(key, snapshot, &self.options.page_cache)?,
                };
                if !written_here && changed {
                    keep[row] = false;
                    conflicts.push(row as u32);
                }
            }
        }
        if !conflicts.is_empty() {
            return Ok(WriteOutcome {
                rows: 0,
                conflicts,
                visible_at: None,
            });
        }
        // Whether a key exists: as the transaction left it, else as the tablet has it.
        let exists = |key: &[u8]| -> Result<bool, StorageError> {
            match own.and_then(|t| t.present.get(key)) {
                Some(&present) => Ok(present),
                None => state.exists(key, &self.options.page_cache),
            }
        };
        let mut seen: HashSet<&[u8]> = HashSet::new();
        for (row, key) in keys.iter().enumerate() {
            if !keep[row] {
                continue;
            }
            let repeated = !seen.insert(key.as_slice());
            let duplicate = || StorageError::DuplicateKey {
                key: format_key(&schema, &rows, row),
            };
            match batch.kind {
                WriteKind::Insert if repeated || exists(key)? => return Err(duplicate()),
                WriteKind::InsertIgnore if repeated || exists(key)? => keep[row] = false,
                WriteKind::Update | WriteKind::Delete if repeated => return Err(duplicate()),
                WriteKind::Update | WriteKind::Delete if !exists(key)? => {
                    return Err(StorageError::KeyNotFound {
                        key: format_key(&schema, &rows, row),
                    })
                }
                _ => {}
            }
        }
        let kept = keep.iter().filter(|&&k| k).count();
        let rows = match kept == rows.num_rows() {
            true => rows,
            false => arrow::compute::filter_record_batch(&rows, &keep.clone().into())?,
        };
        let present = batch.kind != WriteKind::Delete;
        let kept_keys: Vec<Vec<u8>> = (keys.into_iter().zip(&keep))
            .filter(|(_, &k)| k)
            .map(|(key, _)| key)
            .collect();
        let pending = state.txns.entry(txn).or_insert_with(|| PendingTxn::new(ts));
        pending.last_write = ts;
        if kept > 0 {
            pending.writes.push(WriteBatch::new(batch.kind, rows));
        }
        for key in &kept_keys {
            pending.present.insert(key.clone(), present);
        }
        for key in kept_keys {
            state.locks.insert(key, txn);
        }
        // Visible only once the transaction commits.
        Ok(WriteOutcome {
            rows: kept,
            conflicts,
            visible_at: None,
        })
    }

    /// Applies log entry `index`: transaction `txn` is committing at a timestamp of at least
    /// `ts`; whether this prepared it (false: it was prepared before, at its first prepare's
    /// timestamp). A transaction without writes here is an error (its writes were lost, so it
    /// must not commit).
    pub fn prepare_txn(&self, index: u64, ts: Timestamp, txn: u64) -> Result<bool, StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        if !state.queue_blockers(txn).is_empty() {
            // One transaction inserting into a queue commits at a time, so positions (taken
            // at the commit) increase with the commit timestamps.
            return Err(StorageError::Locked {
                key: "(the queue's next positions: another transaction is committing)".into(),
            });
        }
        match state.txns.get_mut(&txn) {
            Some(pending) => {
                let first = pending.prepared.is_none();
                pending.prepared.get_or_insert(ts);
                Ok(first)
            }
            None => Err(StorageError::TxnState(format!(
                "transaction {txn} has no writes in this tablet"
            ))),
        }
    }

    /// Applies log entry `index`: transaction `txn` is no longer prepared (it may prepare
    /// again); its prepare timestamp, if it was prepared.
    pub fn unprepare_txn(&self, index: u64, txn: u64) -> Option<Timestamp> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        state.txns.get_mut(&txn).and_then(|t| t.prepared.take())
    }

    /// Applies log entry `index`: transaction `txn` commits at `ts`, its writes become visible
    /// and its keys unlocked. Returns the rows applied (0 for a transaction unknown here: one
    /// already finished).
    pub fn commit_txn(&self, index: u64, ts: Timestamp, txn: u64) -> Result<usize, StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        let unprepared_inserts =
            (state.txns.get(&txn)).is_some_and(|t| t.prepared.is_none() && t.inserts());
        let other_committing = (state.txns.iter()).any(|(&id, t)| id != txn && t.commits_inserts());
        if state.schema.position_column().is_some() && unprepared_inserts && other_committing {
            // Committing at once, its rows would take positions above the prepared one's and
            // yet become visible before them: it waits (as a plain insert does).
            return Err(StorageError::Locked {
                key: "(the queue's next positions: another transaction is committing)".into(),
            });
        }
        let Some(pending) = state.txns.remove(&txn) else {
            return Ok(0);
        };
        for key in pending.present.keys() {
            state.locks.remove(key);
        }
        let mut rows = 0;
        let schema = state.schema.clone();
        let mut inserted = 0;
        for write in pending.writes {
            let kind = write.kind;
            let write_rows = match queue_write(&schema, kind)? {
                // A queue's new rows take their positions now, from the commit's log entry.
                QueueWrite::Insert => {
                    let n = write.rows.num_rows() as u64;
                    let entry = state.entry_position(index);
                    let positioned = with_positions(&schema, &write.rows, entry, inserted, false)?;
                    inserted += n;
                    positioned
                }
                QueueWrite::Other => write.rows,
            };
            // Checked when written, and their keys were locked since: this cannot fail but
            // on damaged storage.
            rows += self.apply_rows(&mut state, ts, kind, write_rows)?;
        }
        Ok(rows)
    }

    /// Applies log entry `index`: transaction `txn` aborts; its writes here are dropped.
    pub fn abort_txn(&self, index: u64, txn: u64) {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        if let Some(pending) = state.txns.remove(&txn) {
            for key in pending.present.keys() {
                state.locks.remove(key);
            }
        }
    }

    /// Transaction `txn`, if it has pending writes here.
    pub fn txn_state(&self, txn: u64) -> Option<TxnState> {
        let state = self.state.read();
        state.txns.get(&txn).map(|p| TxnState {
            txn,
            last_write: p.last_write,
            prepared: p.prepared,
        })
    }

    /// The other transactions whose commit must apply here before transaction `txn` may be
    /// prepared: in a queue table, those committing inserts while `txn` inserts too (see
    /// [`Self::prepare_txn`]).
    pub fn queue_prepare_blockers(&self, txn: u64) -> Vec<u64> {
        self.state.read().queue_blockers(txn)
    }

    /// Whether a transaction is prepared here and not yet committed or aborted.
    pub(super) fn has_prepared_txns(&self) -> bool {
        self.state
            .read()
            .txns
            .values()
            .any(|t| t.prepared.is_some())
    }

    /// The transactions with pending writes here.
    pub fn pending_txns(&self) -> Vec<TxnState> {
        let state = self.state.read();
        (state.txns.iter())
            .map(|(&txn, p)| TxnState {
                txn,
                last_write: p.last_write,
                prepared: p.prepared,
            })
            .collect()
    }
}

impl State {
    /// See [`Tablet::queue_prepare_blockers`].
    fn queue_blockers(&self, txn: u64) -> Vec<u64> {
        let inserts = self.txns.get(&txn).is_some_and(|t| t.inserts());
        if self.schema.position_column().is_none() || !inserts {
            return Vec::new();
        }
        (self.txns.iter())
            .filter(|&(&id, t)| id != txn && t.commits_inserts())
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether `key` has a live version.
    fn exists(&self, key: &[u8], cache: &crate::PageCache) -> Result<bool, StorageError> {
        Ok(!matches!(
            self.locate(key, cache)?,
            super::write::Location::Absent
        ))
    }

    /// The first of `keys` (rows of `rows`) that a pending transaction has locked.
    pub(super) fn locked_row(&self, keys: &[Vec<u8>]) -> Option<usize> {
        if self.locks.is_empty() {
            return None;
        }
        keys.iter().position(|k| self.locks.contains_key(k))
    }
}

/// File holding the pending transactions a flush made durable.
pub(super) fn file_name(id: u64) -> String {
    format!("txns-{id}")
}

const MAGIC: &[u8; 8] = b"NYTXNS01";

/// Writes `txns` to `path`: magic, then per transaction its id, latest write, prepare timestamp (0:
/// none) and writes (length-prefixed encoded batches), then a CRC32 of all that.
pub(super) fn write_file(
    path: &Path,
    txns: &BTreeMap<u64, PendingTxn>,
) -> Result<(), StorageError> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(txns.len() as u64).to_le_bytes());
    for (&txn, pending) in txns {
        out.extend_from_slice(&txn.to_le_bytes());
        out.extend_from_slice(&pending.last_write.0.to_le_bytes());
        out.extend_from_slice(&pending.prepared.map_or(0, |t| t.0).to_le_bytes());
        out.extend_from_slice(&(pending.writes.len() as u64).to_le_bytes());
        for write in &pending.writes {
            let bytes = write.encode();
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            out.extend_from_slice(&bytes);
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    let mut file = std::fs::File::create(path)?;
    file.write_all(&out)?;
    file.sync_all()?;
    Ok(())
}

/// Reads a file [`write_file`] wrote: the pending transactions and their locks.
pub(super) fn read_file(path: &Path, schema: &crate::Schema) -> Result<Pending, StorageError> {
    let bytes = std::fs::read(path).map_err(StorageError::on(path))?;
    let bad =
        |what: &str| StorageError::Corruption(format!("{} is damaged: {what}", path.display()));
    let (body, crc) = bytes
        .split_last_chunk::<4>()
        .ok_or_else(|| bad("too short"))?;
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(bad("checksum mismatch"));
    }
    let mut reader = Reader(
        body.strip_prefix(MAGIC)
            .ok_or_else(|| bad("not a transactions file"))?,
    );
    let truncated = || bad("truncated");
    let mut txns = BTreeMap::new();
    let mut locks = HashMap::new();
    for _ in 0..reader.u64().ok_or_else(truncated)? {
        let mut field = || reader.u64().ok_or_else(truncated);
        let (txn, last_write, prepared, writes) = (field()?, field()?, field()?, field()?);
        let mut pending = PendingTxn {
            writes: Vec::new(),
            present: HashMap::new(),
            prepared: Some(Timestamp(prepared)).filter(|t| t.0 != 0),
            last_write: Timestamp(last_write),
        };
        for _ in 0..writes {
            let len = reader.u64().ok_or_else(truncated)?;
            let encoded = reader.bytes(len).ok_or_else(truncated)?;
            let write = WriteBatch::decode(encoded)?;
            for key in encode_keys(schema, &write.rows)? {
                locks.insert(key.clone(), txn);
                pending.present.insert(key, write.kind != WriteKind::Delete);
            }
            pending.writes.push(write);
        }
        txns.insert(txn, pending);
    }
    Ok((txns, locks))
}

/// Reads a transactions file's fields in order.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u64(&mut self) -> Option<u64> {
        let (n, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*n))
    }

    fn bytes(&mut self, len: u64) -> Option<&'a [u8]> {
        let (bytes, rest) = self.0.split_at_checked(usize::try_from(len).ok()?)?;
        self.0 = rest;
        Some(bytes)
    }
}
