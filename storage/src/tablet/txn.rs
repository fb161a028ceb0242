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
//! In a queue table (a POSITION column), new rows take their positions when they are applied,
//! so positions follow the log; readers must also see them become visible in that order, or a
//! consumer could see position 9 and later find a position 8 it skipped. So committed inserts
//! take turns ([`Turn`]): one applies only when no transaction prepared below its commit
//! timestamp is still undecided (that one could commit below it), and turns go in commit
//! timestamp order. Many transactions inserting into one queue tablet can thus be prepared and
//! decided at once; only the application of their rows is ordered. A turn that waits holds back
//! the replica's snapshots at its timestamp, as a prepared transaction does ([`Holds`]).
//!
//! Pending transactions and turns survive flushes: a flush that makes entries of a pending
//! transaction durable writes the transaction's writes to a file the metadata names
//! (`txns-<id>`), read back on open. Every step is deterministic, so replicas and replays
//! agree.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::write::{queue_write, waiting_queue_rows, with_positions, QueueWrite};
use super::{State, Tablet};
use crate::key::KeyMap;
use crate::key::{encode_keys, format_key, SeenKeys};
use crate::{StorageError, Timestamp, WriteBatch, WriteKind, WriteOutcome};

/// A transaction's writes in this tablet, not yet committed or aborted.
#[derive(Clone)]
pub(super) struct PendingTxn {
    /// The writes, checked and in order, as the commit applies them.
    writes: Vec<WriteBatch>,
    /// Whether each key the transaction wrote exists after its writes.
    present: KeyMap<bool>,
    /// The prepare timestamp, once prepared.
    pub(super) prepared: Option<Timestamp>,
    /// The timestamp of its latest write here.
    last_write: Timestamp,
}

impl PendingTxn {
    fn new(ts: Timestamp) -> Self {
        PendingTxn {
            writes: Vec::new(),
            present: KeyMap::default(),
            prepared: None,
            last_write: ts,
        }
    }
}

/// Whether `writes` insert rows.
fn inserts(writes: &[WriteBatch]) -> bool {
    (writes.iter()).any(|w| matches!(w.kind, WriteKind::Insert | WriteKind::InsertIgnore))
}

/// Committed rows of a queue table waiting for their turn to be applied (see the module
/// comment): a transaction's commit, or a plain insert.
#[derive(Clone)]
pub(super) struct Turn {
    /// The transaction, whose keys stay locked until its rows are applied.
    txn: Option<u64>,
    keys: Vec<Vec<u8>>,
    /// The timestamp the replica holds snapshots back at until then.
    pub(super) held: Timestamp,
    writes: Vec<WriteBatch>,
}

/// Turns, by (commit timestamp, the log index of the entry that committed them).
pub(super) type Turns = BTreeMap<(Timestamp, u64), Turn>;

/// Pending transactions, the keys they locked, and the turns waiting.
pub(super) type Pending = (BTreeMap<u64, PendingTxn>, KeyMap<u64>, Turns);

/// Timestamps at which the applied log entries made the replica start or stop holding back
/// snapshots (a scan at or above a held timestamp waits), and the newest timestamp rows became
/// visible at through a turn. The replica takes them after each entry ([`Tablet::take_holds`]).
#[derive(Debug, Default, PartialEq)]
pub struct Holds {
    pub hold: Vec<Timestamp>,
    pub release: Vec<Timestamp>,
    pub visible: Option<Timestamp>,
}

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
            let rows = waiting_queue_rows(&schema, &batch.rows, WriteKind::Insert)?;
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
        let mut seen = SeenKeys::new(&keys);
        for (row, key) in keys.iter().enumerate() {
            if !keep[row] {
                continue;
            }
            let repeated = !seen.first(key.as_slice());
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
        pending.present.reserve(kept_keys.len());
        for key in &kept_keys {
            pending.present.insert(key.clone(), present);
        }
        state.locks.reserve(kept_keys.len());
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
        match state.txns.get_mut(&txn) {
            Some(pending) => {
                let first = pending.prepared.is_none();
                pending.prepared.get_or_insert(ts);
                if first {
                    // Held until the commit or abort (on every replica, and on replay).
                    state.holds.hold.push(ts);
                }
                Ok(first)
            }
            None => Err(StorageError::TxnState(format!(
                "transaction {txn} has no writes in this tablet"
            ))),
        }
    }

    /// Applies log entry `index`: transaction `txn` is no longer prepared (it may prepare
    /// again). Written by servers before queue transactions took turns (kept for their logs).
    pub fn unprepare_txn(&self, index: u64, txn: u64) -> Result<(), StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        let unprepared = state.txns.get_mut(&txn).and_then(|t| t.prepared.take());
        state.holds.release.extend(unprepared);
        self.take_turns(&mut state, index)
    }

    /// Applies log entry `index`: transaction `txn` commits at `ts`, its writes become visible
    /// and its keys unlocked; in a queue table, when its turn comes (see the module comment),
    /// maybe at a later entry. Returns the rows it commits (0 for a transaction unknown here:
    /// one already finished).
    pub fn commit_txn(&self, index: u64, ts: Timestamp, txn: u64) -> Result<usize, StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        let Some(pending) = state.txns.remove(&txn) else {
            return Ok(0);
        };
        let keys: Vec<Vec<u8>> = pending.present.into_keys().collect();
        if state.schema.position_column().is_none() || !inserts(&pending.writes) {
            release_locks(&mut state.locks, &keys);
            state.holds.release.extend(pending.prepared);
            return self.apply_committed(&mut state, index, ts, pending.writes, &mut 0);
        }
        let rows = pending.writes.iter().map(|w| w.rows.num_rows()).sum();
        let held = pending.prepared.unwrap_or_else(|| {
            state.holds.hold.push(ts);
            ts
        });
        let turn = Turn {
            txn: Some(txn),
            keys,
            held,
            writes: pending.writes,
        };
        state.turns.insert((ts, index), turn);
        self.take_turns(&mut state, index)?;
        Ok(rows)
    }

    /// Applies log entry `index`: transaction `txn` aborts; its writes here are dropped.
    pub fn abort_txn(&self, index: u64, txn: u64) -> Result<(), StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        if let Some(pending) = state.txns.remove(&txn) {
            let keys: Vec<Vec<u8>> = pending.present.into_keys().collect();
            release_locks(&mut state.locks, &keys);
            state.holds.release.extend(pending.prepared);
        }
        self.take_turns(&mut state, index)
    }

    /// A plain insert into a queue table at `ts` (log entry `index`) that must wait for its
    /// turn ([`State::waits_for_turn`]): its `rows` are checked, their positions not yet set.
    pub(super) fn insert_in_turn(
        &self,
        state: &mut State,
        index: u64,
        ts: Timestamp,
        rows: WriteBatch,
    ) -> WriteOutcome {
        let n = rows.rows.num_rows();
        state.holds.hold.push(ts);
        let turn = Turn {
            txn: None,
            keys: Vec::new(),
            held: ts,
            writes: vec![rows],
        };
        state.turns.insert((ts, index), turn);
        // Visible at `ts` once applied; snapshots at or above it wait until then.
        WriteOutcome {
            rows: n,
            conflicts: Vec::new(),
            visible_at: Some(ts),
        }
    }

    /// Applies, as log entry `index`, the turns that have come: in commit timestamp order, each
    /// once no transaction prepared below its timestamp is undecided.
    fn take_turns(&self, state: &mut State, index: u64) -> Result<(), StorageError> {
        let mut inserted = 0;
        while let Some((&(at, _), _)) = state.turns.first_key_value() {
            if state.undecided_below(at) {
                break;
            }
            let Some((_, turn)) = state.turns.pop_first() else {
                break;
            };
            for key in &turn.keys {
                state.locks.remove(key);
            }
            self.apply_committed(state, index, at, turn.writes, &mut inserted)?;
            state.holds.release.push(turn.held);
            state.holds.visible = state.holds.visible.max(Some(at));
        }
        Ok(())
    }

    /// Applies a transaction's `writes` at `ts` as log entry `index`; a queue's new rows take
    /// their positions from the entry, after the `inserted` rows it gave positions already.
    fn apply_committed(
        &self,
        state: &mut State,
        index: u64,
        ts: Timestamp,
        writes: Vec<WriteBatch>,
        inserted: &mut u64,
    ) -> Result<usize, StorageError> {
        let schema = state.schema.clone();
        let mut rows = 0;
        for write in writes {
            let kind = write.kind;
            let write_rows = match queue_write(&schema, kind)? {
                QueueWrite::Insert => {
                    let entry = state.entry_position(index);
                    let positioned = with_positions(&schema, &write.rows, entry, *inserted, false)?;
                    *inserted += write.rows.num_rows() as u64;
                    positioned
                }
                QueueWrite::Other => write.rows,
            };
            // Checked when written, and their keys were locked since: this cannot fail but
            // on damaged storage, and new rows' keys are still absent.
            rows += self.apply_rows(state, ts, kind, write_rows, true)?;
        }
        Ok(rows)
    }

    /// The timestamps the applied entries made the replica start or stop holding snapshots
    /// back at, since this was last called (or, first, those of the transactions and turns
    /// read when the tablet was opened).
    pub fn take_holds(&self) -> Holds {
        std::mem::take(&mut self.state.write().holds)
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

    /// Whether committed rows of a queue wait for their turn.
    pub fn turns_waiting(&self) -> bool {
        !self.state.read().turns.is_empty()
    }

    /// Whether a transaction is prepared here and not yet committed or aborted, or committed
    /// rows wait for their turn.
    pub(super) fn has_prepared_txns(&self) -> bool {
        let state = self.state.read();
        !state.turns.is_empty() || state.txns.values().any(|t| t.prepared.is_some())
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
    /// Whether transactions are pending or committed rows wait for their turn (what a flush
    /// must keep in a file, and what a schema change waits for).
    pub(super) fn has_pending(&self) -> bool {
        !self.txns.is_empty() || !self.turns.is_empty()
    }

    /// Whether a queue's rows inserted at `ts` must wait for their turn: turns wait already,
    /// or a transaction prepared below `ts` is undecided.
    pub(super) fn waits_for_turn(&self, ts: Timestamp) -> bool {
        !self.turns.is_empty() || self.undecided_below(ts)
    }

    /// Whether a transaction that inserts here was prepared below `ts` and is undecided (in a
    /// queue table, it may still commit below `ts`).
    pub(super) fn undecided_below(&self, ts: Timestamp) -> bool {
        (self.txns.values()).any(|t| t.prepared.is_some_and(|p| p < ts) && inserts(&t.writes))
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
/// Releases the locks a transaction holds on `keys` (every key it wrote, each locked by it
/// alone): when they are all the locks there are (a bulk load, a lone transaction), at once.
fn release_locks(locks: &mut KeyMap<u64>, keys: &[Vec<u8>]) {
    if locks.len() == keys.len() {
        locks.clear();
        locks.shrink_to(0);
        return;
    }
    for key in keys {
        locks.remove(key);
    }
}

pub(super) fn file_name(id: u64) -> String {
    format!("txns-{id}")
}

const MAGIC: &[u8; 8] = b"NYTXNS02";
/// Files written before turns (no turns section).
const MAGIC_V1: &[u8; 8] = b"NYTXNS01";

/// Writes `txns` and `turns` to `path`: magic; the number of transactions, then per
/// transaction its id, latest write, prepare timestamp (0: none) and writes; the number of
/// turns, then per turn its commit timestamp, log index, whether it is a transaction's (1) or a
/// plain insert (0), the transaction's id (0 for none), held timestamp and writes; then a CRC32 of all that. Writes are a count, then
/// length-prefixed encoded batches.
pub(super) fn write_file(
    path: &Path,
    txns: &BTreeMap<u64, PendingTxn>,
    turns: &Turns,
) -> Result<(), StorageError> {
    let mut out = MAGIC.to_vec();
    let put = |out: &mut Vec<u8>, n: u64| out.extend_from_slice(&n.to_le_bytes());
    let put_writes = |out: &mut Vec<u8>, writes: &[WriteBatch]| {
        out.extend_from_slice(&(writes.len() as u64).to_le_bytes());
        for write in writes {
            let bytes = write.encode();
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            out.extend_from_slice(&bytes);
        }
    };
    put(&mut out, txns.len() as u64);
    for (&txn, pending) in txns {
        put(&mut out, txn);
        put(&mut out, pending.last_write.0);
        put(&mut out, pending.prepared.map_or(0, |t| t.0));
        put_writes(&mut out, &pending.writes);
    }
    put(&mut out, turns.len() as u64);
    for (&(at, index), turn) in turns {
        put(&mut out, at.0);
        put(&mut out, index);
        put(&mut out, u64::from(turn.txn.is_some()));
        put(&mut out, turn.txn.unwrap_or(0));
        put(&mut out, turn.held.0);
        put_writes(&mut out, &turn.writes);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    let mut file = std::fs::File::create(path)?;
    file.write_all(&out)?;
    file.sync_all()?;
    Ok(())
}

/// Reads a file [`write_file`] wrote: the pending transactions, their locks and the turns.
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
    let (mut reader, with_turns) = match (body.strip_prefix(MAGIC), body.strip_prefix(MAGIC_V1)) {
        (Some(rest), _) => (Reader(rest), true),
        (None, Some(rest)) => (Reader(rest), false),
        (None, None) => return Err(bad("not a transactions file")),
    };
    let truncated = || bad("truncated");
    // A transaction's writes, and the keys they lock (a queue's new rows lock none).
    let writes =
        |reader: &mut Reader| -> Result<(Vec<WriteBatch>, Vec<(Vec<u8>, bool)>), StorageError> {
            let mut writes = Vec::new();
            let mut keys = Vec::new();
            for _ in 0..reader.u64().ok_or_else(truncated)? {
                let len = reader.u64().ok_or_else(truncated)?;
                let bytes = reader.bytes(len).ok_or_else(truncated)?;
                let write = WriteBatch::decode(&bytes::Bytes::copy_from_slice(bytes))?;
                if let QueueWrite::Other = queue_write(schema, write.kind)? {
                    let present = write.kind != WriteKind::Delete;
                    keys.extend(
                        encode_keys(schema, &write.rows)?
                            .into_iter()
                            .map(|k| (k, present)),
                    );
                }
                writes.push(write);
            }
            Ok((writes, keys))
        };
    let mut txns = BTreeMap::new();
    let mut locks = KeyMap::default();
    for _ in 0..reader.u64().ok_or_else(truncated)? {
        let mut field = || reader.u64().ok_or_else(truncated);
        let (txn, last_write, prepared) = (field()?, field()?, field()?);
        let (batches, keys) = writes(&mut reader)?;
        let mut pending = PendingTxn {
            writes: batches,
            present: KeyMap::default(),
            prepared: Some(Timestamp(prepared)).filter(|t| t.0 != 0),
            last_write: Timestamp(last_write),
        };
        for (key, present) in keys {
            locks.insert(key.clone(), txn);
            pending.present.insert(key, present);
        }
        txns.insert(txn, pending);
    }
    let mut turns = Turns::new();
    if with_turns {
        for _ in 0..reader.u64().ok_or_else(truncated)? {
            let mut field = || reader.u64().ok_or_else(truncated);
            let (at, index, of_txn, txn, held) = (field()?, field()?, field()?, field()?, field()?);
            let txn = (of_txn != 0).then_some(txn);
            let (batches, keys) = writes(&mut reader)?;
            let keys: Vec<Vec<u8>> = keys.into_iter().map(|(k, _)| k).collect();
            if let Some(txn) = txn {
                locks.extend(keys.iter().map(|k| (k.clone(), txn)));
            }
            let turn = Turn {
                txn,
                keys,
                held: Timestamp(held),
                writes: batches,
            };
            turns.insert((Timestamp(at), index), turn);
        }
    }
    Ok((txns, locks, turns))
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
