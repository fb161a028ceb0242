//! The tablet: a MemRowSet, DiskRowSets with their delta stores, and the metadata that ties them.
//!
//! Writes are applied by the Raft thread in log order ([`Tablet::apply`]); each write batch is
//! validated completely before anything changes, so it applies entirely or not at all, and the
//! outcome depends only on the tablet's state and the batch (replicas and replays agree).
//!
//! Flushing writes the MemRowSet's rows as new DiskRowSets (newest image as base data, older
//! versions as UNDO records) and each rowset's DeltaMemStore as a REDO file, and then switches
//! to the new set of files by replacing `metadata` atomically (temp file, fsync, rename, fsync
//! directory). The metadata records `durable_index`, the last log entry whose effects the files
//! contain; the WAL is replayed from there. Compactions ([`Tablet::maintenance_ops`]) rewrite
//! files that hold the same rows and switch the same way. Files the metadata does not name (left
//! by a crash mid-flush or mid-compaction) are deleted on open.
//!
//! Writes go on while a flush or compaction writes its files ([`Tablet::rewrite`]): a flush
//! freezes the MemRowSet and the DeltaMemStores (still read until it switches) and new writes
//! go to new ones; at the switch, the changes made meanwhile are carried over to the new files.
//!
//! History is kept for [`TabletOptions::history_max_age`]: a scan may read at any snapshot
//! since then, and rewrites drop versions older than that.
//!
//! The module's files, one concept each: `metadata.rs` (the persisted tablet metadata),
//! `write.rs` (the write path), `scan.rs` (scans and key lookups), `rewrite.rs` (the switch to
//! rewritten files with the writes made meanwhile carried over), `compaction.rs` (what a flush
//! and each compaction write), `maintenance.rs` (which of those are worth doing, and how much),
//! `alter.rs` (schema changes), `clone.rs` (table clones sharing the files) and `requests.rs`
//! (the clients' requests applied lately, so that none is applied twice).

mod alter;
mod changes;
mod clone;
mod compaction;
mod maintenance;
mod metadata;
mod requests;
mod rewrite;
mod scan;
mod txn;
mod write;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::delta::{DeltaFile, DeltaMeta, RowsetDeltas};
use crate::diskrowset::{ColumnFile, ColumnRange, DiskRowSet};
use crate::key::KeyMap;
use crate::memrowset::{MemRowSet, RowArena};
use crate::rowset_tree::RowSetTree;
use crate::PageCache;
use crate::{Schema, StorageError, Timestamp};

pub use changes::{change_fields, CHANGE_COLUMN, COMMIT_TIME_COLUMN};
pub use maintenance::{MaintenanceKind, MaintenanceOp};
use metadata::{read_metadata, write_metadata, Metadata, METADATA};
pub use requests::{RequestId, REQUEST_RETENTION};
pub use txn::{Holds, TxnState};

#[derive(Clone, Debug)]
pub struct TabletOptions {
    /// MemRowSet + delta memory at which the tablet asks to be flushed.
    pub flush_threshold_bytes: usize,
    /// Target size of one DiskRowSet.
    pub rowset_target_bytes: usize,
    /// How far back snapshot scans may read (Kudu's `tablet_history_max_age_sec`). Older
    /// versions are dropped when their files are rewritten.
    pub history_max_age: Duration,
    /// Most bytes of rowsets one rowset compaction rewrites.
    pub compaction_budget_bytes: u64,
    /// Column files a rowset may have: a major delta compaction rewrites only the columns
    /// that REDO records change while the rowset has fewer, and the whole rowset otherwise
    /// (0: always whole).
    pub max_column_files: usize,
    /// Decoded pages of rowsets that key lookups read (keys, and the data pages of the rows
    /// found), shared by the tablets whose options are clones of one another.
    pub page_cache: Arc<PageCache>,
    /// For crash tests: called at each step of a flush, compaction or schema change; `true`
    /// makes that step fail as if the process had died there (what is on disk stays as it is).
    pub fail_point: Option<FailPoint>,
}

/// See [`TabletOptions::fail_point`]. Steps: `rowset_written`, `delta_written`,
/// `metadata_staged` (the new metadata written but not yet renamed into place) and
/// `metadata_switched`.
#[derive(Clone)]
pub struct FailPoint(pub Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for FailPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FailPoint")
    }
}

impl Default for TabletOptions {
    fn default() -> Self {
        Self {
            flush_threshold_bytes: 64 << 20,
            rowset_target_bytes: 32 << 20,
            history_max_age: Duration::from_secs(15 * 60),
            compaction_budget_bytes: 128 << 20,
            max_column_files: 4,
            page_cache: Arc::new(PageCache::new(256 << 20)),
            fail_point: None,
        }
    }
}

/// A tablet: one partition of a table, in a directory of its own. Writes are applied in log
/// order, scans read at a snapshot, and flushes and compactions rewrite its files while both go
/// on (see the module documentation of `tablet` in the source).
///
/// ```no_run
/// # use nyala_storage::*;
/// # fn sketch(dir: &std::path::Path, schema: Schema, rows: arrow::array::RecordBatch,
/// #     ts: Timestamp, spec: ScanSpec) -> Result<(), StorageError> {
/// let tablet = Tablet::create(dir, schema, TabletOptions::default())?; // later: Tablet::open
/// tablet.apply(1, ts, &WriteBatch::new(WriteKind::Insert, rows))?; // log entry 1, atomic
/// for batch in tablet.scan(&ScanSpec { snapshot: ts, ..spec })? { let _rows = batch?; }
/// if tablet.needs_flush() { tablet.flush()?; } // MemRowSet -> DiskRowSets; durable_index 1
/// for op in tablet.maintenance_ops() { tablet.compact(&op.kind)?; } // best first
/// # Ok(()) }
/// ```
pub struct Tablet {
    dir: PathBuf,
    options: TabletOptions,
    state: RwLock<State>,
    /// Held by a flush, compaction or schema change: one at a time.
    rewriting: Mutex<()>,
    /// Compactions run since the tablet was opened.
    compactions: std::sync::atomic::AtomicU64,
    /// [`Tablet::column_ranges`] of the rowsets named (by address), kept until they change.
    ranges: Mutex<Option<(Vec<usize>, Vec<ColumnRange>)>>,
    /// How long history is kept, in seconds: the table's own retention, or
    /// [`TabletOptions::history_max_age`] (read without the state lock, which callers may
    /// hold).
    history_max_age: std::sync::atomic::AtomicU64,
}

struct State {
    /// The schema of every row in the MemRowSet, the arena and the rowsets.
    schema: Arc<Schema>,
    arena: RowArena,
    mrs: MemRowSet,
    /// The MemRowSet a flush is writing (readable until the flush switches; its images stay in
    /// the arena): keys whose newest versions are in `mrs` may have older ones here.
    frozen: Option<Arc<MemRowSet>>,
    /// Keys of `frozen` that writes gave versions in `mrs`.
    frozen_keys_written: Vec<crate::KeyBytes>,
    rowsets: Vec<Arc<DiskRowSet>>,
    /// Parallel to `rowsets`.
    deltas: Vec<RowsetDeltas>,
    /// The key ranges of `rowsets`, for lookups.
    tree: RowSetTree,
    next_rowset_id: u64,
    last_applied: u64,
    durable_index: u64,
    next_auto_id: i64,
    /// Transactions with writes here not yet committed or aborted, and the keys they locked
    /// (see `txn.rs`).
    txns: BTreeMap<u64, txn::PendingTxn>,
    locks: KeyMap<u64>,
    /// Committed rows of a queue table waiting for their turn (see `txn.rs`).
    turns: txn::Turns,
    /// See [`Tablet::take_holds`].
    holds: txn::Holds,
    /// The file holding the pending transactions as of `durable_index`, if there were any.
    txns_file: Option<u64>,
    /// See [`Metadata::position_base`].
    position_base: u64,
    /// The clients' requests applied lately (see `requests.rs`).
    requests: requests::Requests,
}

impl Tablet {
    pub fn create(
        dir: &Path,
        schema: Schema,
        options: TabletOptions,
    ) -> Result<Tablet, StorageError> {
        std::fs::create_dir_all(dir)?;
        // No rowsets yet; rowset ids and auto_incrementing_ids start at 1.
        let meta = Metadata::of(&schema, &[], &[], 1, 0, 1, None);
        write_metadata(dir, &meta, &|_| Ok(()))?;
        Ok(Tablet::opened(
            dir,
            options,
            meta,
            vec![],
            vec![],
            Default::default(),
        ))
    }

    pub fn open(dir: &Path, options: TabletOptions) -> Result<Tablet, StorageError> {
        let mut meta = read_metadata(dir)?;
        let table = Arc::new(meta.schema.clone());
        let mut rowsets = Vec::new();
        let mut deltas = Vec::new();
        let mut names = HashSet::new();
        for &id in &meta.rowsets {
            names.insert(DiskRowSet::file_name(id));
            let checksum = meta.checksums.get(&id).copied();
            let column_files = meta.column_files.remove(&id).unwrap_or_default();
            names.extend(column_files.iter().map(|f| ColumnFile::file_name(f.id)));
            let column_ids = meta.rowset_columns.remove(&id);
            rowsets.push(Arc::new(DiskRowSet::open(
                dir,
                id,
                checksum,
                &column_files,
                &table,
                column_ids.as_deref(),
            )?));
            let files = meta.deltas.remove(&id).unwrap_or_default();
            let mut open = |m: DeltaMeta| -> Result<Arc<DeltaFile>, StorageError> {
                names.insert(DeltaFile::file_name(m.id));
                Ok(Arc::new(DeltaFile::open(dir, m, &table)?))
            };
            let undo = files
                .undo
                .into_iter()
                .map(&mut open)
                .collect::<Result<_, _>>()?;
            let redo = files.redo.into_iter().map(open).collect::<Result<_, _>>()?;
            deltas.push(RowsetDeltas::new(undo, redo)?);
        }
        let pending = match meta.txns_file {
            Some(id) => {
                names.insert(txn::file_name(id));
                txn::read_file(&dir.join(txn::file_name(id)), &meta.schema)?
            }
            None => Default::default(),
        };
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name != METADATA && !names.contains(&name) {
                tracing::info!(file = %entry.path().display(), "removing file left by an interrupted flush or compaction");
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(Tablet::opened(dir, options, meta, rowsets, deltas, pending))
    }

    /// The tablet of `dir` with the files `meta` names (`rowsets`, and their `deltas`
    /// parallel), opened, and nothing in memory but the `pending` transactions.
    fn opened(
        dir: &Path,
        options: TabletOptions,
        meta: Metadata,
        rowsets: Vec<Arc<DiskRowSet>>,
        deltas: Vec<RowsetDeltas>,
        pending: txn::Pending,
    ) -> Tablet {
        let (txns, locks, turns) = pending;
        // Transactions prepared and turns waiting before the last flush (the entries that
        // held them back are not replayed).
        let holds = txn::Holds {
            hold: (txns.values().filter_map(|t| t.prepared))
                .chain(turns.values().map(|t| t.held))
                .collect(),
            ..Default::default()
        };
        // A queue table's new rows come in runs of neighbouring keys.
        let queue = meta.schema.position_column().is_some();
        let history_max_age = retention(&meta.schema, &options).into();
        Tablet {
            history_max_age,
            dir: dir.to_path_buf(),
            options,
            compactions: Default::default(),
            ranges: Mutex::default(),
            rewriting: Mutex::new(()),
            state: RwLock::new(State {
                schema: Arc::new(meta.schema),
                arena: RowArena::default(),
                mrs: MemRowSet::new(queue),
                frozen: None,
                frozen_keys_written: Vec::new(),
                tree: key_ranges(&rowsets),
                rowsets,
                deltas,
                next_rowset_id: meta.next_rowset_id,
                last_applied: meta.durable_index,
                durable_index: meta.durable_index,
                next_auto_id: meta.next_auto_id.max(1),
                txns,
                locks,
                turns,
                holds,
                txns_file: meta.txns_file,
                position_base: meta.position_base,
                requests: requests::Requests::from_persisted(meta.requests),
            }),
        }
    }

    /// The ancient history mark: the oldest snapshot a scan may read at now.
    pub fn ancient_history_mark(&self) -> Timestamp {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let kept = Duration::from_secs(self.history_max_age.load(Ordering::Relaxed));
        Timestamp::from_micros(now.saturating_sub(kept).as_micros() as u64)
    }

    /// Takes the history retention of `schema` (the table's, or the server's), once it is
    /// the tablet's schema.
    fn keep_history_of(&self, schema: &Schema) {
        (self.history_max_age).store(retention(schema, &self.options), Ordering::Relaxed);
    }

    /// Refuses a read at `snapshot` if the history it needs is no longer kept.
    pub(crate) fn check_history(&self, snapshot: Timestamp) -> Result<(), StorageError> {
        let ancient = self.ancient_history_mark();
        match snapshot < ancient {
            true => Err(StorageError::SnapshotTooOld {
                snapshot: snapshot.display(),
                oldest: ancient.display(),
                retention: format!(
                    "{} s, history_max_age_secs",
                    self.history_max_age.load(Ordering::Relaxed)
                ),
            }),
            false => Ok(()),
        }
    }

    pub fn schema(&self) -> Arc<Schema> {
        self.state.read().schema.clone()
    }

    /// The lowest auto_incrementing_id no write has used.
    pub fn next_auto_id(&self) -> i64 {
        self.state.read().next_auto_id
    }

    pub fn durable_index(&self) -> u64 {
        self.state.read().durable_index
    }

    pub fn memory_bytes(&self) -> usize {
        let s = self.state.read();
        s.arena.bytes() + s.mrs.bytes() + s.frozen.as_ref().map_or(0, |f| f.bytes())
    }

    /// Rows in the MemRowSet and the DiskRowSets, counting deleted and updated rows too.
    pub fn estimated_rows(&self) -> usize {
        let state = self.state.read();
        let frozen = state.frozen.as_ref().map_or(0, |f| f.len());
        state.mrs.len() + frozen + state.rowsets.iter().map(|r| r.num_rows()).sum::<usize>()
    }

    /// What the DiskRowSets' statistics say of each column's values (rows in memory are not
    /// counted: an estimate for planning, never a bound to rely on).
    pub fn column_ranges(&self) -> Vec<ColumnRange> {
        let columns = self.schema().columns().len();
        let rowsets = self.state.read().rowsets.clone();
        let names: Vec<usize> = rowsets.iter().map(|r| Arc::as_ptr(r) as usize).collect();
        let mut cached = self.ranges.lock();
        if let Some((_, ranges)) = cached.as_ref().filter(|(named, _)| *named == names) {
            return ranges.clone();
        }
        let per_rowset: Vec<&[ColumnRange]> =
            rowsets.iter().map(|r| r.column_ranges(columns)).collect();
        let ranges = match per_rowset.is_empty() {
            true => Vec::new(),
            false => (0..columns)
                .map(|c| ColumnRange::merge_all(per_rowset.iter().map(|r| &r[c])))
                .collect(),
        };
        *cached = Some((names, ranges.clone()));
        ranges
    }

    /// Memory the DiskRowSets hold for key lookups (packed keys and bloom filters, and the
    /// index of the newest REDO record of each updated row).
    pub fn key_index_bytes(&self) -> usize {
        let state = self.state.read();
        state
            .rowsets
            .iter()
            .map(|r| r.key_index_bytes())
            .sum::<usize>()
            + state.deltas.iter().map(|d| d.memory_bytes()).sum::<usize>()
    }

    pub fn rowset_count(&self) -> usize {
        self.state.read().rowsets.len()
    }

    pub fn rowset_ids(&self) -> Vec<u64> {
        self.state.read().rowsets.iter().map(|r| r.id).collect()
    }

    /// Compactions run since the tablet was opened.
    pub fn compactions(&self) -> u64 {
        self.compactions.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Column files of all rowsets (see [`ColumnFile`]).
    pub fn column_file_count(&self) -> usize {
        let state = self.state.read();
        state.rowsets.iter().map(|r| r.column_files().len()).sum()
    }

    /// UNDO and REDO files of all rowsets.
    pub fn delta_file_count(&self) -> usize {
        self.state
            .read()
            .deltas
            .iter()
            .map(|d| d.files().count())
            .sum()
    }

    pub fn disk_bytes(&self) -> u64 {
        let state = self.state.read();
        let deltas = state.deltas.iter().flat_map(|d| d.files());
        state.rowsets.iter().map(|r| r.disk_bytes()).sum::<u64>()
            + deltas.map(|f| f.disk_bytes()).sum::<u64>()
    }

    fn fail(&self, step: &str) -> Result<(), StorageError> {
        match &self.options.fail_point {
            Some(FailPoint(fail)) if fail(step) => Err(StorageError::Io(std::io::Error::other(
                format!("injected failure at {step}"),
            ))),
            _ => Ok(()),
        }
    }
}

impl State {
    /// The position of the first row log entry `index` inserts into a queue table:
    /// `position_base + (index << POSITION_ROW_BITS)`.
    fn entry_position(&self, index: u64) -> u64 {
        self.position_base + (index << write::POSITION_ROW_BITS)
    }
}

/// The interval tree of the rowsets' key ranges.
fn key_ranges(rowsets: &[Arc<DiskRowSet>]) -> RowSetTree {
    RowSetTree::new(rowsets.iter().map(|r| match r.key_bounds() {
        None => (vec![u8::MAX], Vec::new()), // covers nothing
        Some((first, last)) => (first.to_vec(), last.to_vec()),
    }))
}

/// How long a tablet of `schema` keeps its history, in seconds.
fn retention(schema: &Schema, options: &TabletOptions) -> u64 {
    (schema.history_max_age_secs()).unwrap_or(options.history_max_age.as_secs())
}
