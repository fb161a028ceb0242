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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{cast, interleave, take};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::delta::{DeltaFile, DeltaMeta, Image, Layout, RowsetDeltas};
use crate::diskrowset::{ColumnFile, ColumnFileMeta, DiskRowSet};
use crate::history::{self, Chain, NewFiles};
use crate::key::{encode_keys, format_key};
use crate::memrowset::{visible, MemRowSet, RowArena, RowRef, Version};
use crate::rowset_tree::RowSetTree;
use crate::scan::{self, ScanIterator, ScanSpec, Source};
use crate::{ColumnType, KeyCache};
use crate::{Schema, StorageError, Timestamp, WriteBatch, WriteKind};
use arrow::array::AsArray;

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
    /// Decoded pages of rowset keys for lookups, shared by the tablets whose options are
    /// clones of one another.
    pub key_cache: Arc<KeyCache>,
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
            key_cache: Arc::new(KeyCache::new(256 << 20)),
            fail_point: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Metadata {
    schema: Schema,
    rowsets: Vec<u64>,
    /// The delta files of rowsets that have any, by rowset id.
    #[serde(default)]
    deltas: BTreeMap<u64, DeltaFiles>,
    /// CRC32 of each rowset's file, by rowset id.
    #[serde(default)]
    checksums: BTreeMap<u64, u32>,
    /// The column files of rowsets that have any, oldest first, by rowset id.
    #[serde(default)]
    column_files: BTreeMap<u64, Vec<ColumnFileMeta>>,
    next_rowset_id: u64,
    durable_index: u64,
    /// Above every auto_incrementing_id written so far.
    #[serde(default)]
    next_auto_id: i64,
}

#[derive(Serialize, Deserialize, Default)]
struct DeltaFiles {
    /// Oldest first (metadata written before there could be several holds one or null).
    #[serde(deserialize_with = "one_or_more")]
    undo: Vec<DeltaMeta>,
    redo: Vec<DeltaMeta>,
}

fn one_or_more<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<DeltaMeta>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMore {
        More(Vec<DeltaMeta>),
        One(Option<DeltaMeta>),
    }
    Ok(match OneOrMore::deserialize(d)? {
        OneOrMore::More(files) => files,
        OneOrMore::One(file) => file.into_iter().collect(),
    })
}

const METADATA: &str = "metadata";

pub struct Tablet {
    dir: PathBuf,
    options: TabletOptions,
    state: RwLock<State>,
    /// Held by a flush, compaction or schema change: one at a time.
    rewriting: Mutex<()>,
    /// Compactions run since the tablet was opened.
    compactions: std::sync::atomic::AtomicU64,
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
    frozen_keys_written: Vec<Vec<u8>>,
    rowsets: Vec<Arc<DiskRowSet>>,
    /// Parallel to `rowsets`.
    deltas: Vec<RowsetDeltas>,
    /// The key ranges of `rowsets`, for lookups.
    tree: RowSetTree,
    next_rowset_id: u64,
    last_applied: u64,
    durable_index: u64,
    next_auto_id: i64,
}

/// Where the live version of a key is.
enum Location {
    Absent,
    Mem(RowRef),
    /// In rowset `rs` at `ordinal`.
    Disk {
        rs: usize,
        ordinal: u32,
    },
}

/// The rowset index [`State::locate_at`] gives rows of the MemRowSet.
const IN_MEMROWSET: usize = usize::MAX;

/// A background operation on a tablet's files, with the benefit it is expected to bring
/// (comparable across operations and tablets; below 1 it is not worth its I/O).
#[derive(Clone, Debug, PartialEq)]
pub struct MaintenanceOp {
    pub kind: MaintenanceKind,
    pub score: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MaintenanceKind {
    /// Merge a rowset's REDO files into one (minor delta compaction).
    MergeRedo { rowset: u64 },
    /// Rewrite a rowset with its REDO records applied to the base data (major delta
    /// compaction); older versions become UNDO records, expired history is dropped.
    ApplyRedo { rowset: u64 },
    /// Drop a rowset's UNDO records older than the history retention.
    TrimUndo { rowset: u64 },
    /// Merge rowsets whose key ranges overlap into non-overlapping ones (rowset compaction).
    MergeRowsets { rowsets: Vec<u64> },
}

impl Tablet {
    pub fn create(
        dir: &Path,
        schema: Schema,
        options: TabletOptions,
    ) -> Result<Tablet, StorageError> {
        std::fs::create_dir_all(dir)?;
        let meta = Metadata {
            schema: schema.clone(),
            rowsets: vec![],
            deltas: BTreeMap::new(),
            checksums: BTreeMap::new(),
            column_files: BTreeMap::new(),
            next_rowset_id: 1,
            durable_index: 0,
            next_auto_id: 1,
        };
        write_metadata(dir, &meta, &|_| Ok(()))?;
        Ok(Tablet {
            dir: dir.to_path_buf(),
            options,
            compactions: Default::default(),
            rewriting: Mutex::new(()),
            state: RwLock::new(State {
                schema: Arc::new(schema),
                arena: RowArena::default(),
                mrs: MemRowSet::default(),
                frozen: None,
                frozen_keys_written: Vec::new(),
                rowsets: vec![],
                deltas: vec![],
                tree: RowSetTree::default(),
                next_rowset_id: 1,
                last_applied: 0,
                durable_index: 0,
                next_auto_id: 1,
            }),
        })
    }

    pub fn open(dir: &Path, options: TabletOptions) -> Result<Tablet, StorageError> {
        let mut meta = read_metadata(dir)?;
        let mut rowsets = Vec::new();
        let mut deltas = Vec::new();
        let mut names = HashSet::new();
        for &id in &meta.rowsets {
            names.insert(DiskRowSet::file_name(id));
            let checksum = meta.checksums.get(&id).copied();
            let column_files = meta.column_files.remove(&id).unwrap_or_default();
            names.extend(column_files.iter().map(|f| ColumnFile::file_name(f.id)));
            rowsets.push(Arc::new(DiskRowSet::open(
                dir,
                id,
                checksum,
                &column_files,
                &meta.schema,
            )?));
            let files = meta.deltas.remove(&id).unwrap_or_default();
            let mut open = |m: DeltaMeta| -> Result<Arc<DeltaFile>, StorageError> {
                names.insert(DeltaFile::file_name(m.id));
                Ok(Arc::new(DeltaFile::open(dir, m)?))
            };
            let undo = files
                .undo
                .into_iter()
                .map(&mut open)
                .collect::<Result<_, _>>()?;
            let redo = files.redo.into_iter().map(open).collect::<Result<_, _>>()?;
            deltas.push(RowsetDeltas::new(undo, redo)?);
        }
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name != METADATA && !names.contains(&name) {
                tracing::info!(file = %entry.path().display(), "removing file left by an interrupted flush or compaction");
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(Tablet {
            dir: dir.to_path_buf(),
            options,
            compactions: Default::default(),
            rewriting: Mutex::new(()),
            state: RwLock::new(State {
                schema: Arc::new(meta.schema),
                arena: RowArena::default(),
                mrs: MemRowSet::default(),
                frozen: None,
                frozen_keys_written: Vec::new(),
                tree: key_ranges(&rowsets),
                rowsets,
                deltas,
                next_rowset_id: meta.next_rowset_id,
                last_applied: meta.durable_index,
                durable_index: meta.durable_index,
                next_auto_id: meta.next_auto_id.max(1),
            }),
        })
    }

    /// The ancient history mark: the oldest snapshot a scan may read at now.
    pub fn ancient_history_mark(&self) -> Timestamp {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::from_micros(now.saturating_sub(self.options.history_max_age).as_micros() as u64)
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

    pub fn needs_flush(&self) -> bool {
        self.flush_score() >= 1.0
    }

    /// How full the in-memory data is: 1 at the flush threshold.
    pub fn flush_score(&self) -> f64 {
        self.memory_bytes() as f64 / self.options.flush_threshold_bytes.max(1) as f64
    }

    /// Rows in the MemRowSet and the DiskRowSets, counting deleted and updated rows too.
    pub fn estimated_rows(&self) -> usize {
        let state = self.state.read();
        let frozen = state.frozen.as_ref().map_or(0, |f| f.len());
        state.mrs.len() + frozen + state.rowsets.iter().map(|r| r.num_rows()).sum::<usize>()
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

    /// Applies one write batch at `ts` as log entry `index`: all rows or none.
    pub fn apply(
        &self,
        index: u64,
        ts: Timestamp,
        batch: &WriteBatch,
    ) -> Result<usize, StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        self.apply_locked(&mut state, ts, batch)
    }

    fn apply_locked(
        &self,
        state: &mut State,
        ts: Timestamp,
        batch: &WriteBatch,
    ) -> Result<usize, StorageError> {
        let schema = state.schema.clone();
        let rows = Self::conform(&schema, batch)?;
        let n = rows.num_rows();
        if n == 0 {
            return Ok(0);
        }
        if let (Some(c), WriteKind::Insert | WriteKind::InsertIgnore) =
            (schema.auto_increment_column(), batch.kind)
        {
            let ids = rows
                .column_by_name(&schema.columns()[c].name)
                .and_then(|ids| {
                    arrow::compute::max(ids.as_primitive_opt::<arrow::datatypes::Int64Type>()?)
                });
            if let Some(max) = ids {
                state.next_auto_id = state.next_auto_id.max(max.saturating_add(1));
            }
        }
        let keys = encode_keys(&schema, &rows)?;
        // Validate every row before changing anything.
        let mut seen = HashSet::with_capacity(n);
        let mut locations = Vec::with_capacity(n);
        // Rows not applied: superseded by a later image of their key (UPSERT), or skipped
        // because their key exists or came earlier in the batch (INSERT IGNORE).
        let mut applied = vec![true; n];
        for (row, key) in keys.iter().enumerate() {
            if !seen.insert(key.as_slice()) {
                match batch.kind {
                    WriteKind::Upsert => {
                        // The last image of a key in one UPSERT wins.
                        for (earlier, k) in keys.iter().enumerate().take(row) {
                            if k == key {
                                applied[earlier] = false;
                            }
                        }
                    }
                    WriteKind::InsertIgnore => applied[row] = false,
                    _ => {
                        return Err(StorageError::DuplicateKey {
                            key: format_key(&schema, &rows, row),
                        })
                    }
                }
            }
            let location = state.locate(key, &self.options.key_cache)?;
            match (batch.kind, &location) {
                (WriteKind::Insert, Location::Mem(_) | Location::Disk { .. }) => {
                    return Err(StorageError::DuplicateKey {
                        key: format_key(&schema, &rows, row),
                    })
                }
                (WriteKind::InsertIgnore, Location::Mem(_) | Location::Disk { .. }) => {
                    applied[row] = false;
                }
                (WriteKind::Update | WriteKind::Delete, Location::Absent) => {
                    return Err(StorageError::KeyNotFound {
                        key: format_key(&schema, &rows, row),
                    })
                }
                _ => {}
            }
            locations.push(location);
        }
        // New full row images: the batch's rows for INSERT/UPSERT, old rows with the changed
        // columns replaced for UPDATE, none for DELETE.
        let images: Option<Vec<RowRef>> = match batch.kind {
            WriteKind::Insert | WriteKind::InsertIgnore | WriteKind::Upsert => {
                Some(state.arena.append(rows.clone()))
            }
            WriteKind::Update => Some(updated_rows(state, &rows, &locations)?),
            WriteKind::Delete => None,
        };
        // The columns a change of a flushed row may change: those the UPDATE sets, all but
        // the key for an UPSERT, none for a DELETE (a deletion changes no column).
        let changed: Vec<u32> = match batch.kind {
            WriteKind::Delete => vec![],
            _ => (0..schema.columns().len())
                .filter(|&c| !schema.is_key_column(c))
                .filter(|&c| rows.column_by_name(&schema.columns()[c].name).is_some())
                .map(|c| c as u32)
                .collect(),
        };
        for (row, (key, location)) in keys.into_iter().zip(locations).enumerate() {
            if !applied[row] {
                continue;
            }
            let version = Version {
                ts,
                row: images.as_ref().map(|i| i[row]),
            };
            match location {
                Location::Disk { rs, ordinal, .. } => {
                    let dms = &mut state.deltas[rs].dms;
                    dms.push(ordinal, version);
                    dms.changed.extend(&changed);
                }
                Location::Mem(_) | Location::Absent => {
                    let frozen = state.frozen.as_ref();
                    if frozen.is_some_and(|f| f.index.contains_key(&key))
                        && !state.mrs.index.contains_key(&key)
                    {
                        state.frozen_keys_written.push(key.clone());
                    }
                    state.mrs.push(key, version)
                }
            }
        }
        if batch.kind == WriteKind::InsertIgnore {
            return Ok(applied.iter().filter(|&&a| a).count());
        }
        Ok(n)
    }

    /// Checks a batch's columns against the schema and returns it in the shape the kind needs:
    /// full table rows for INSERT/UPSERT, key + changed columns for UPDATE, keys for DELETE.
    fn conform(schema: &Schema, batch: &WriteBatch) -> Result<RecordBatch, StorageError> {
        let table = schema.arrow_schema();
        let rows = &batch.rows;
        for field in rows.schema().fields() {
            if table.index_of(field.name()).is_err() {
                return Err(StorageError::SchemaMismatch(format!(
                    "unknown column '{}'",
                    field.name()
                )));
            }
        }
        let wanted: Vec<usize> = match batch.kind {
            WriteKind::Insert | WriteKind::InsertIgnore | WriteKind::Upsert => {
                (0..table.fields().len()).collect()
            }
            WriteKind::Delete => schema.key_columns().to_vec(),
            WriteKind::Update => {
                let mut cols = schema.key_columns().to_vec();
                for (i, f) in table.fields().iter().enumerate() {
                    if !cols.contains(&i) && rows.column_by_name(f.name()).is_some() {
                        cols.push(i);
                    }
                }
                cols
            }
        };
        let mut columns = Vec::with_capacity(wanted.len());
        for &c in &wanted {
            let field = table.field(c);
            let column = rows.column_by_name(field.name()).ok_or_else(|| {
                StorageError::SchemaMismatch(format!("missing column '{}'", field.name()))
            })?;
            let column = if column.data_type() == field.data_type() {
                column.clone()
            } else if matches!((column.data_type(), field.data_type()),
                (arrow::datatypes::DataType::Timestamp(u1, _), arrow::datatypes::DataType::Timestamp(u2, _)) if u1 == u2)
            {
                cast(column, field.data_type())?
            } else {
                return Err(StorageError::SchemaMismatch(format!(
                    "column '{}' is {}, got {}",
                    field.name(),
                    schema.columns()[c].column_type.sql_name(),
                    column.data_type()
                )));
            };
            if let ColumnType::Varchar { length: limit } = schema.columns()[c].column_type {
                let longest = column
                    .as_string::<i32>()
                    .iter()
                    .flatten()
                    .map(|v| v.chars().count())
                    .max()
                    .unwrap_or(0);
                if longest > limit as usize {
                    return Err(StorageError::TooLong {
                        column: field.name().clone(),
                        length: longest,
                        limit,
                    });
                }
            }
            if column.null_count() > 0 {
                if schema.is_key_column(c) {
                    return Err(StorageError::NullKey {
                        column: field.name().clone(),
                    });
                }
                if !field.is_nullable() {
                    return Err(StorageError::NullValue {
                        column: field.name().clone(),
                    });
                }
            }
            columns.push(column);
        }
        let schema = Arc::new(table.project(&wanted)?);
        Ok(RecordBatch::try_new(schema, columns)?)
    }

    pub fn scan(&self, spec: &ScanSpec) -> Result<ScanIterator, StorageError> {
        let ancient = self.ancient_history_mark();
        if spec.snapshot < ancient {
            return Err(StorageError::SnapshotTooOld {
                snapshot: spec.snapshot.display(),
                oldest: ancient.display(),
            });
        }
        let state = self.state.read();
        let schema = &state.schema;
        let (read_columns, output_len) = scan::read_columns(schema, spec)?;
        let table = schema.arrow_schema();
        if let Some(keys) = scan::point_keys(schema, &spec.predicates) {
            return self.lookup(&state, spec, keys, read_columns, output_len);
        }
        let batch_size = spec.batch_size.max(1);
        let mut sources = std::collections::VecDeque::new();
        for (rowset, deltas) in state.rowsets.iter().zip(&state.deltas) {
            let (hidden, images) = deltas.view(
                rowset,
                spec.snapshot,
                &table,
                &read_columns,
                &state.arena,
                None,
            )?;
            sources.push_back(Source::Rowset(Box::new(rowset.reader(
                schema,
                &read_columns,
                &hidden,
                &spec.predicates,
                batch_size,
            )?)));
            sources.extend(images.into_iter().map(Source::Batch));
        }
        let mem_rows = state.visible_mem_rows(spec.snapshot);
        for chunk in mem_rows.chunks(batch_size) {
            sources.push_back(Source::Batch(state.arena.gather(
                &table,
                &read_columns,
                chunk,
            )?));
        }
        Ok(scan::boxed(scan::Scan {
            schema: (**schema).clone(),
            read_columns,
            output_len,
            predicates: spec.predicates.clone(),
            remaining: spec.limit,
            sources,
        }))
    }

    /// A scan whose predicates pin every key column to a few values: each key is found through
    /// the MemRowSet index and the rowsets' key indexes instead of reading the rowsets.
    fn lookup(
        &self,
        state: &State,
        spec: &ScanSpec,
        keys: Vec<Vec<u8>>,
        read_columns: Vec<usize>,
        output_len: usize,
    ) -> Result<ScanIterator, StorageError> {
        let table = state.schema.arrow_schema();
        let mut sources = std::collections::VecDeque::new();
        let mut in_memory = Vec::new();
        for key in keys {
            let cache = &self.options.key_cache;
            let Some((rs, ordinal, image)) = state.locate_at(&key, spec.snapshot, cache)? else {
                continue;
            };
            let row = match image {
                Image::Mem(row) if rs == IN_MEMROWSET => {
                    in_memory.push(row);
                    continue;
                }
                Image::File { file, row } => {
                    let row = state.deltas[rs]
                        .file(file)
                        .ok_or_else(|| StorageError::Corruption("missing delta file".into()))?
                        .read_images(&[row])?;
                    RecordBatch::try_new(table.clone(), row.columns().to_vec())?
                        .project(&read_columns)?
                }
                // Images put together from per-column deltas.
                Image::Undo | Image::Mem(_) => {
                    let (_, images) = state.deltas[rs].view(
                        &state.rowsets[rs],
                        spec.snapshot,
                        &table,
                        &read_columns,
                        &state.arena,
                        Some(ordinal),
                    )?;
                    arrow::compute::concat_batches(
                        &Arc::new(table.project(&read_columns)?),
                        &images,
                    )?
                }
                Image::Base | Image::Absent => {
                    let row = state.rowsets[rs].read_rows(&read_columns, &[ordinal])?;
                    RecordBatch::try_new_with_options(
                        Arc::new(table.project(&read_columns)?),
                        row.columns().to_vec(),
                        &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
                    )?
                }
            };
            sources.push_back(Source::Batch(row));
        }
        if !in_memory.is_empty() {
            sources.push_back(Source::Batch(state.arena.gather(
                &table,
                &read_columns,
                &in_memory,
            )?));
        }
        Ok(scan::boxed(scan::Scan {
            schema: (*state.schema).clone(),
            read_columns,
            output_len,
            predicates: spec.predicates.clone(),
            remaining: spec.limit,
            sources,
        }))
    }

    fn fail(&self, step: &str) -> Result<(), StorageError> {
        match &self.options.fail_point {
            Some(FailPoint(fail)) if fail(step) => Err(StorageError::Io(std::io::Error::other(
                format!("injected failure at {step}"),
            ))),
            _ => Ok(()),
        }
    }

    fn write_metadata(&self, meta: &Metadata) -> Result<(), StorageError> {
        write_metadata(&self.dir, meta, &|step| self.fail(step))
    }

    /// Writes in-memory rows and deltas to new files and switches to them atomically. Writes
    /// go on meanwhile (see [`Tablet::rewrite`]).
    pub fn flush(&self) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        self.flush_rewriting()
    }

    /// [`Tablet::flush`], with `rewriting` held.
    fn flush_rewriting(&self) -> Result<(), StorageError> {
        let (snapshot, durable) = {
            let mut state = self.state.write();
            let durable = state.last_applied;
            let dirty = !state.mrs.is_empty() || state.deltas.iter().any(|d| !d.dms.is_empty());
            if !dirty && state.durable_index == durable {
                return Ok(());
            }
            // Writes from now on go to a new MemRowSet and new DeltaMemStores; these are
            // written out.
            let frozen = std::mem::take(&mut state.mrs);
            state.frozen = Some(Arc::new(frozen));
            for d in state.deltas.iter_mut().filter(|d| !d.dms.is_empty()) {
                d.frozen = Some(Arc::new(std::mem::take(&mut d.dms)));
            }
            (Snapshot::of(&state), durable)
        };
        let ancient = self.ancient_history_mark();
        let schema = snapshot.schema.clone();
        self.rewrite(&snapshot, &schema, durable, Carry::Flush, |snap, files| {
            let table = schema.arrow_schema();
            let mut out = Vec::with_capacity(snap.rowsets.len());
            // Each DeltaMemStore becomes a REDO file of its rowset.
            for (i, (rowset, d)) in snap.rowsets.iter().zip(&snap.deltas).enumerate() {
                let mut flushed = d.without_dms();
                if let Some(frozen) = &d.frozen {
                    let (records, images) = d.frozen_records(rowset, &table, &snap.arena)?;
                    let layout = Layout {
                        columns: None,
                        changed: Some(frozen.changed.iter().copied().collect()),
                    };
                    flushed.add_redo(files.delta(&schema, layout, &[&images], &records)?)?;
                }
                out.push(Output::same(rowset.clone(), flushed, i));
            }
            // The MemRowSet: every key's versions, in key order, rolled at the target size.
            let Some(frozen) = &snap.frozen else {
                return Ok(out);
            };
            let sources: Vec<&RecordBatch> = snap.arena.batches().iter().collect();
            let chains = frozen.index.iter().map(|(key, versions)| Chain {
                key: key.clone(),
                versions: versions
                    .iter()
                    .map(|v| (v.ts, v.row.map(|r| snap.arena.index(r))))
                    .collect(),
            });
            let bytes = snap.arena.bytes() as u64;
            let rows_per_rowset = self.rows_per_rowset(bytes, frozen.len());
            for new in
                history::write_chains(files, &schema, &sources, chains, ancient, rows_per_rowset)?
            {
                out.push(Output::new(new));
            }
            Ok(out)
        })
    }

    /// Runs `f` to write new files from `snap` (no lock held: scans and writes go on), then,
    /// under the write lock, carries over what writes changed meanwhile, switches to the
    /// rowsets `f` returns with one metadata write (naming `schema` and `durable_index`), and
    /// removes the files no longer named. A failure before the switch removes the new files
    /// and leaves the tablet as it was.
    ///
    /// The caller holds `rewriting`: one flush, compaction or schema change at a time.
    fn rewrite<F>(
        &self,
        snap: &Snapshot,
        schema: &Schema,
        durable_index: u64,
        carry: Carry,
        f: F,
    ) -> Result<(), StorageError>
    where
        F: FnOnce(&Snapshot, &mut NewFiles) -> Result<Vec<Output>, StorageError>,
    {
        let fail = |step: &str| self.fail(step);
        let mut files = NewFiles {
            dir: &self.dir,
            next_id: snap.next_rowset_id,
            paths: Vec::new(),
            fail: &fail,
            key_cache: &self.options.key_cache,
        };
        let mut result = f(snap, &mut files);
        // Where the rows changed in memory so far went, found before taking the write lock
        // (reading keys); the switch looks up only rows changed after this.
        let mut moves = Moves::default();
        if let Ok(out) = &result {
            let pending = self.pending_moves(&self.state.read(), snap, out, carry, &moves);
            if let Err(e) = self.locate_moves(snap, out, pending, &mut moves) {
                result = Err(e);
            }
        }
        let mut state = self.state.write();
        // The ids handed out stay used: the metadata on disk may name them even after a failure.
        state.next_rowset_id = files.next_id;
        let next = result.and_then(|out| self.carry_over(&state, snap, out, carry, moves));
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                files.remove_all();
                state.thaw();
                return Err(e);
            }
        };
        let named: HashSet<&Path> = next
            .rowsets
            .iter()
            .flat_map(|r| r.paths())
            .chain(next.deltas.iter().flat_map(|d| d.files().map(|f| f.path())))
            .collect();
        let old_files: Vec<PathBuf> = (state.rowsets.iter().flat_map(|r| r.paths()))
            .chain(
                state
                    .deltas
                    .iter()
                    .flat_map(|d| d.files().map(|f| f.path())),
            )
            .filter(|p| !named.contains(p))
            .map(Path::to_path_buf)
            .collect();
        let written = self.write_metadata(&Metadata {
            schema: schema.clone(),
            rowsets: next.rowsets.iter().map(|r| r.id).collect(),
            checksums: (next.rowsets.iter())
                .filter_map(|r| Some((r.id, r.checksum?)))
                .collect(),
            column_files: (next.rowsets.iter())
                .filter(|r| !r.column_files().is_empty())
                .map(|r| {
                    let files = r.column_files().iter().map(|f| f.meta.clone());
                    (r.id, files.collect())
                })
                .collect(),
            deltas: (next.rowsets.iter().zip(&next.deltas))
                .filter(|(_, d)| d.files().next().is_some())
                .map(|(r, d)| {
                    let undo = d.undo.iter().map(|f| f.meta.clone()).collect();
                    let redo = d.redo.iter().map(|f| f.meta.clone()).collect();
                    (r.id, DeltaFiles { undo, redo })
                })
                .collect(),
            next_rowset_id: state.next_rowset_id,
            durable_index,
            next_auto_id: state.next_auto_id,
        });
        if let Err(e) = written {
            state.thaw();
            return Err(e);
        }
        // The new state is durable; the replaced files are garbage now (open scans keep their
        // file handles or have read what they need).
        for path in old_files {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "could not remove a replaced file");
            }
        }
        // Rowsets that keep their rows keep their DeltaMemStores (after a flush, the versions
        // written since it froze them); versions of rows that moved follow them.
        let mut deltas = next.deltas;
        for (d, origin) in deltas.iter_mut().zip(&next.origins) {
            if let Some(i) = origin {
                d.dms = std::mem::take(&mut state.deltas[*i].dms);
            }
        }
        let mut incoming: BTreeMap<usize, Vec<(u32, Vec<Version>)>> = BTreeMap::new();
        for (i, rows) in next.carried_rows {
            // The replaced rowset's store, taken whole: its rows in the order `rows` lists them.
            let old = std::mem::take(&mut state.deltas[i].dms.by_ordinal);
            for ((_, versions), (j, ordinal)) in old.into_iter().zip(rows) {
                incoming.entry(j).or_default().push((ordinal, versions));
            }
        }
        for (key, j, ordinal) in next.carried_keys {
            let versions = state.mrs.remove(&key);
            incoming.entry(j).or_default().push((ordinal, versions));
        }
        for (j, rows) in incoming {
            deltas[j].dms.add_rows(rows);
        }
        for (j, changed) in next.changed {
            deltas[j].dms.changed.extend(changed);
        }
        state.schema = Arc::new(schema.clone());
        state.tree = key_ranges(&next.rowsets);
        state.rowsets = next.rowsets;
        state.deltas = deltas;
        if let Carry::Flush = carry {
            state.frozen = None;
            state.frozen_keys_written.clear();
            // The images the flush wrote leave the arena.
            state.arena.drop_before(snap.arena.end());
        }
        state.durable_index = durable_index;
        state.last_applied = state.last_applied.max(durable_index);
        Ok(())
    }

    /// The tablet's next rowsets (`out`, files written from `snap`) and where the changes
    /// writes made since `snap` go: a rowset with the same rows as one of `snap` takes its
    /// DeltaMemStore (after a flush, the versions written since the freeze); the changes of
    /// rows that moved to new rowsets (DeltaMemStore versions of replaced rowsets, and after a
    /// flush new MemRowSet versions of keys the flushed MemRowSet held) follow them by key
    /// (`moves` says where those found so far went).
    fn carry_over(
        &self,
        state: &State,
        snap: &Snapshot,
        out: Vec<Output>,
        carry: Carry,
        mut moves: Moves,
    ) -> Result<Next, StorageError> {
        let pending = self.pending_moves(state, snap, &out, carry, &moves);
        self.locate_moves(snap, &out, pending, &mut moves)?;
        let schema = &state.schema;
        let non_key: Vec<u32> = (0..schema.columns().len())
            .filter(|&c| !schema.is_key_column(c))
            .map(|c| c as u32)
            .collect();
        let mut carried_rows = Vec::new();
        let mut changed: BTreeMap<usize, BTreeSet<u32>> = BTreeMap::new();
        for &i in &replaced_rowsets(snap, &out) {
            let live = &state.deltas[i].dms;
            let mut rows = Vec::with_capacity(live.by_ordinal.len());
            let mut targets = BTreeSet::new();
            for &ordinal in live.by_ordinal.keys() {
                let Some(&Some((j, o))) = moves.rows.get(&(i, ordinal)) else {
                    return Err(StorageError::Corruption(
                        "a changed row is missing from rewritten rowsets".into(),
                    ));
                };
                rows.push((j, o));
                targets.insert(j);
            }
            for j in targets {
                changed.entry(j).or_default().extend(&live.changed);
            }
            if !rows.is_empty() {
                carried_rows.push((i, rows));
            }
        }
        // Keys of the flushed MemRowSet written meanwhile: their new versions follow the
        // rows into the new rowsets (unless deleted there).
        let mut carried_keys = Vec::new();
        if let Carry::Flush = carry {
            for key in &state.frozen_keys_written {
                if let Some(&Some((j, o))) = moves.keys.get(key) {
                    carried_keys.push((key.clone(), j, o));
                    changed.entry(j).or_default().extend(&non_key);
                }
            }
        }
        let origins = out.iter().map(|o| o.origin).collect();
        let (rowsets, deltas) = out.into_iter().map(|o| (o.rowset, o.deltas)).unzip();
        Ok(Next {
            rowsets,
            deltas,
            origins,
            carried_rows,
            carried_keys,
            changed,
        })
    }

    /// The rows changed in memory that moved to new rowsets and are not in `moves` yet: the
    /// ordinals of each replaced rowset with DeltaMemStore versions, and after a flush the
    /// flushed keys written since.
    fn pending_moves(
        &self,
        state: &State,
        snap: &Snapshot,
        out: &[Output],
        carry: Carry,
        moves: &Moves,
    ) -> PendingMoves {
        let rows = (replaced_rowsets(snap, out).into_iter())
            .map(|i| {
                let ordinals = state.deltas[i].dms.by_ordinal.keys();
                let new = ordinals.filter(|&&o| !moves.rows.contains_key(&(i, o)));
                (i, new.copied().collect::<Vec<u32>>())
            })
            .filter(|(_, ordinals)| !ordinals.is_empty())
            .collect();
        let keys = match carry {
            Carry::Flush => (state.frozen_keys_written.iter())
                .filter(|k| !moves.keys.contains_key(*k))
                .cloned()
                .collect(),
            Carry::Compaction => Vec::new(),
        };
        (rows, keys)
    }

    /// Finds where the `pending` rows are live in the new rowsets of `out` (reading their
    /// keys from the snapshot's rowsets), into `moves`.
    fn locate_moves(
        &self,
        snap: &Snapshot,
        out: &[Output],
        (rows, keys): PendingMoves,
        moves: &mut Moves,
    ) -> Result<(), StorageError> {
        let cache = &self.options.key_cache;
        let find = |key: &[u8]| {
            let hash = crate::diskrowset::hash_bytes(key);
            for (j, o) in out.iter().enumerate().filter(|(_, o)| o.origin.is_none()) {
                if let Some(ordinal) = o.rowset.find(key, hash, cache)? {
                    if o.deltas.latest(ordinal) != Image::Absent {
                        return Ok(Some((j, ordinal)));
                    }
                }
            }
            Ok::<_, StorageError>(None)
        };
        for (i, ordinals) in rows {
            let found = snap.rowsets[i].read_key_rows(&ordinals)?;
            for (k, ordinal) in ordinals.into_iter().enumerate() {
                moves.rows.insert((i, ordinal), find(found.value(k))?);
            }
        }
        for key in keys {
            let target = find(&key)?;
            moves.keys.insert(key, target);
        }
        Ok(())
    }

    /// Rows per rowset for a rewrite of rowsets that take `bytes` on disk for `rows` rows.
    fn rows_per_rowset(&self, bytes: u64, rows: usize) -> usize {
        let per_row = (bytes as usize / rows.max(1)).max(1);
        (self.options.rowset_target_bytes / per_row).max(1024)
    }

    /// Changes the schema as log entry `index`: flushes, rewrites every rowset and its history
    /// with the new columns (values found by column id; an added column takes its DEFAULT or
    /// NULL), then switches to the new schema and files with one metadata write. A crash before
    /// that write leaves the old schema and files, and replaying the log applies the change again.
    /// (Writes wait meanwhile: they come in log order after this entry.)
    pub fn alter_schema(&self, index: u64, schema: &Schema) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        let old = self.schema();
        let sources = schema.sources_in(&old);
        let key_ids = |s: &Schema| -> Vec<u32> {
            let ids = s.ids();
            s.key_columns().iter().map(|&k| ids[k]).collect()
        };
        if key_ids(schema) != key_ids(&old) {
            return Err(StorageError::InvalidSchema(
                "a schema change cannot change the primary key".into(),
            ));
        }
        for (column, source) in schema.columns().iter().zip(&sources) {
            if let Some(o) = source {
                if old.columns()[*o].column_type != column.column_type {
                    return Err(StorageError::InvalidSchema(format!(
                        "a schema change cannot change the type of column '{}'",
                        column.name
                    )));
                }
            }
        }
        self.flush_rewriting()?;
        let snapshot = Snapshot::of(&self.state.read());
        let ancient = self.ancient_history_mark();
        let table = history::nullable(&schema.arrow_schema());
        self.rewrite(
            &snapshot,
            schema,
            index,
            Carry::Compaction,
            |snap, files| {
                let mut out = Vec::new();
                for (rowset, history) in snap.rowsets.iter().zip(&snap.deltas) {
                    let mut images = Vec::new();
                    let chains =
                        history::rowset_chains(rowset, history, old.columns().len(), &mut images)?;
                    let images = images
                        .iter()
                        .map(|batch| {
                            let columns = schema
                                .columns()
                                .iter()
                                .zip(&sources)
                                .map(|(column, source)| match source {
                                    Some(o) => Ok(batch.column(*o).clone()),
                                    None => default_column(column, batch.num_rows()),
                                })
                                .collect::<Result<Vec<_>, StorageError>>()?;
                            Ok(RecordBatch::try_new(table.clone(), columns)?)
                        })
                        .collect::<Result<Vec<_>, StorageError>>()?;
                    let refs: Vec<&RecordBatch> = images.iter().collect();
                    let rows = rowset.num_rows().max(1);
                    for new in history::write_chains(files, schema, &refs, chains, ancient, rows)? {
                        out.push(Output::new(new));
                    }
                }
                Ok(out)
            },
        )
    }

    /// The background operations worth doing on this tablet's files now, best first.
    pub fn maintenance_ops(&self) -> Vec<MaintenanceOp> {
        let state = self.state.read();
        let ancient = self.ancient_history_mark();
        let mut ops = Vec::new();
        for (rowset, d) in state.rowsets.iter().zip(&state.deltas) {
            let id = rowset.id;
            // Major delta compaction pays when many rows have REDO records: each costs a scan
            // an extra image read and a skipped base row.
            let records = d.applicable_redo_records(ancient);
            let updated = records as f64 / rowset.num_rows().max(1) as f64;
            if updated >= 0.05 {
                ops.push(MaintenanceOp {
                    kind: MaintenanceKind::ApplyRedo { rowset: id },
                    score: 1.0 + updated * 10.0,
                });
            } else if d.redo.len() >= 2 {
                ops.push(MaintenanceOp {
                    kind: MaintenanceKind::MergeRedo { rowset: id },
                    score: (d.redo.len() - 1) as f64,
                });
            }
            let expired = d.undo.iter().filter(|u| u.meta.max_ts <= ancient);
            let expired_bytes: u64 = expired.map(|u| u.disk_bytes().max(1)).sum();
            if expired_bytes > 0 {
                ops.push(MaintenanceOp {
                    kind: MaintenanceKind::TrimUndo { rowset: id },
                    score: 1.0 + expired_bytes as f64 / rowset.disk_bytes().max(1) as f64,
                });
            }
        }
        if let Some(rowsets) = overlapping_rowsets(
            &state.rowsets,
            &state.tree,
            self.options.compaction_budget_bytes,
        ) {
            ops.push(MaintenanceOp {
                score: (rowsets.len() - 1) as f64,
                kind: MaintenanceKind::MergeRowsets { rowsets },
            });
        }
        ops.sort_by(|a, b| b.score.total_cmp(&a.score));
        ops
    }

    /// Runs one maintenance operation (see [`MaintenanceKind`]). Rowsets with changes in
    /// memory are flushed first; changes writes make meanwhile are carried over to the new
    /// files. An operation whose rowsets are gone already does nothing.
    pub fn compact(&self, kind: &MaintenanceKind) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        let ids: Vec<u64> = match kind {
            MaintenanceKind::MergeRedo { rowset }
            | MaintenanceKind::ApplyRedo { rowset }
            | MaintenanceKind::TrimUndo { rowset } => vec![*rowset],
            MaintenanceKind::MergeRowsets { rowsets } => rowsets.clone(),
        };
        let in_memory = {
            let state = self.state.read();
            (state.rowsets.iter().zip(&state.deltas))
                .any(|(r, d)| ids.contains(&r.id) && !d.dms.is_empty())
        };
        if in_memory {
            self.flush_rewriting()?;
        }
        let snapshot = Snapshot::of(&self.state.read());
        let mut indexes = Vec::new();
        for id in &ids {
            match snapshot.rowsets.iter().position(|r| r.id == *id) {
                Some(i) => indexes.push(i),
                None => return Ok(()),
            }
        }
        indexes.sort_unstable();
        if matches!(kind, MaintenanceKind::ApplyRedo { .. })
            && snapshot.deltas[indexes[0]].redo.is_empty()
        {
            return Ok(());
        }
        let ancient = self.ancient_history_mark();
        let schema = snapshot.schema.clone();
        let width = schema.columns().len();
        // A major delta compaction rewrites only the columns that REDO records change, unless
        // that is every column or the rowset has many column or UNDO files already.
        let changed = match kind {
            MaintenanceKind::ApplyRedo { .. } => {
                let few = |n: usize| n < self.options.max_column_files;
                let i = indexes[0];
                snapshot.deltas[i]
                    .changed_columns()
                    .filter(|c| !c.is_empty() && c.len() < width - schema.key_columns().len())
                    .filter(|_| {
                        few(snapshot.rowsets[i].column_files().len())
                            && few(snapshot.deltas[i].undo.len().saturating_sub(1))
                    })
            }
            _ => None,
        };
        self.compactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let durable = snapshot.durable_index;
        self.rewrite(
            &snapshot,
            &schema,
            durable,
            Carry::Compaction,
            |snap, files| {
                let mut out: Vec<Output> = (snap.rowsets.iter().zip(&snap.deltas).enumerate())
                    .filter(|(i, _)| !indexes.contains(i))
                    .map(|(i, (r, d))| Output::same(r.clone(), d.clone(), i))
                    .collect();
                let all: Vec<usize> = (0..width).collect();
                let i = indexes[0];
                let (rowset, d) = (&snap.rowsets[i], &snap.deltas[i]);
                match kind {
                    MaintenanceKind::MergeRedo { .. } => {
                        let mut images = Vec::new();
                        let mut records = Vec::new();
                        for file in &d.redo {
                            let read = file.read(&all)?;
                            for (row, (&ordinal, &ts)) in
                                read.ordinals.iter().zip(&read.ts).enumerate()
                            {
                                let image =
                                    (!read.deleted.value(row)).then_some((images.len(), row));
                                records.push(crate::delta::Record {
                                    ordinal,
                                    ts: Timestamp(ts),
                                    image,
                                });
                            }
                            images.push(read.images);
                        }
                        // Files are in time order and each is sorted: a stable sort by ordinal keeps
                        // every ordinal's records in time order.
                        records.sort_by_key(|r| r.ordinal);
                        let refs: Vec<&RecordBatch> = images.iter().collect();
                        let layout = Layout {
                            columns: None,
                            changed: d.changed_columns().map(|c| c.into_iter().collect()),
                        };
                        let merged = files.delta(&schema, layout, &refs, &records)?;
                        let merged = RowsetDeltas::new(d.undo.clone(), vec![merged])?;
                        out.push(Output::same(rowset.clone(), merged, i));
                    }
                    MaintenanceKind::TrimUndo { .. } => {
                        let kept = d.undo.iter().filter(|u| u.meta.max_ts > ancient);
                        let trimmed = RowsetDeltas::new(kept.cloned().collect(), d.redo.clone())?;
                        out.push(Output::same(rowset.clone(), trimmed, i));
                    }
                    MaintenanceKind::ApplyRedo { .. } if changed.is_some() => {
                        let columns: Vec<u32> = changed.iter().flatten().copied().collect();
                        let new = history::apply_redo_to_columns(
                            files, &schema, rowset, d, &columns, ancient,
                        )?;
                        out.push(Output::same(new.rowset, new.deltas, i));
                    }
                    MaintenanceKind::ApplyRedo { .. } | MaintenanceKind::MergeRowsets { .. } => {
                        let mut images = Vec::new();
                        let mut parts = Vec::new();
                        let (mut bytes, mut rows) = (0, 0);
                        for &i in &indexes {
                            let rowset = &snap.rowsets[i];
                            parts.push(history::rowset_chains(
                                rowset,
                                &snap.deltas[i],
                                width,
                                &mut images,
                            )?);
                            bytes += rowset.disk_bytes();
                            rows += rowset.num_rows();
                        }
                        let chains = history::merge_chains(parts, ancient);
                        let refs: Vec<&RecordBatch> = images.iter().collect();
                        let per_rowset = self.rows_per_rowset(bytes, rows);
                        for new in history::write_chains(
                            files, &schema, &refs, chains, ancient, per_rowset,
                        )? {
                            out.push(Output::new(new));
                        }
                    }
                }
                Ok(out)
            },
        )
    }
}

/// What a flush, compaction or schema change works from: the tablet at its start.
struct Snapshot {
    schema: Arc<Schema>,
    rowsets: Vec<Arc<DiskRowSet>>,
    deltas: Vec<RowsetDeltas>,
    /// The MemRowSet a flush writes.
    frozen: Option<Arc<MemRowSet>>,
    /// The arena's batches at the start.
    arena: RowArena,
    next_rowset_id: u64,
    durable_index: u64,
}

impl Snapshot {
    fn of(state: &State) -> Snapshot {
        Snapshot {
            schema: state.schema.clone(),
            rowsets: state.rowsets.clone(),
            // Files, and a flush's frozen DeltaMemStores (not the live ones).
            deltas: (state.deltas.iter())
                .map(|d| {
                    let mut files = d.without_dms();
                    files.frozen = d.frozen.clone();
                    files
                })
                .collect(),
            frozen: state.frozen.clone(),
            arena: state.arena.clone(),
            next_rowset_id: state.next_rowset_id,
            durable_index: state.durable_index,
        }
    }
}

/// A rowset a rewrite produced: `origin` is the rowset of the snapshot with the same rows in
/// the same order, if there is one.
struct Output {
    rowset: Arc<DiskRowSet>,
    deltas: RowsetDeltas,
    origin: Option<usize>,
}

impl Output {
    fn same(rowset: Arc<DiskRowSet>, deltas: RowsetDeltas, origin: usize) -> Output {
        Output {
            rowset,
            deltas,
            origin: Some(origin),
        }
    }

    fn new(new: history::NewRowset) -> Output {
        Output {
            rowset: new.rowset,
            deltas: new.deltas,
            origin: None,
        }
    }
}

/// How [`Tablet::carry_over`] treats the in-memory changes of a rewrite's rowsets.
#[derive(Clone, Copy)]
enum Carry {
    /// The files hold the snapshot's DeltaMemStores and frozen MemRowSet.
    Flush,
    /// The files hold no in-memory changes.
    Compaction,
}

/// Where rows changed in memory went in a rewrite's new rowsets (None: nowhere live): rows of
/// replaced rowsets by (rowset, ordinal), flushed keys by key.
#[derive(Default)]
struct Moves {
    rows: HashMap<(usize, u32), Option<(usize, u32)>>,
    keys: HashMap<Vec<u8>, Option<(usize, u32)>>,
}

/// Rows to find for [`Moves`]: ordinals by replaced rowset, and keys.
type PendingMoves = (Vec<(usize, Vec<u32>)>, Vec<Vec<u8>>);

/// The rowsets of `snap` whose rows a rewrite moved to new rowsets.
fn replaced_rowsets(snap: &Snapshot, out: &[Output]) -> Vec<usize> {
    (0..snap.rowsets.len())
        .filter(|&i| !out.iter().any(|o| o.origin == Some(i)))
        .collect()
}

/// The state a rewrite switches to (see [`Tablet::carry_over`]).
struct Next {
    rowsets: Vec<Arc<DiskRowSet>>,
    /// Their files (the DeltaMemStores are carried over at the switch).
    deltas: Vec<RowsetDeltas>,
    /// For each rowset, the rowset of the snapshot with the same rows, if any.
    origins: Vec<Option<usize>>,
    /// Rows of replaced rowsets with DeltaMemStore versions: for each such rowset, the rowset
    /// and ordinal each of its changed rows goes to, in ordinal order.
    carried_rows: Vec<(usize, Vec<(usize, u32)>)>,
    /// Keys whose MemRowSet versions go to a rowset's DeltaMemStore: key, rowset, ordinal.
    carried_keys: Vec<(Vec<u8>, usize, u32)>,
    /// The columns the carried versions may change, by rowset.
    changed: BTreeMap<usize, BTreeSet<u32>>,
}

/// The new images of the rows an UPDATE changes (`rows`: key and changed columns), in the
/// arena: for rows in the MemRowSet, their image with the changed columns replaced; for rows
/// on disk, partial images of the changed columns only (per-column deltas, so an update reads
/// no row from disk).
fn updated_rows(
    state: &mut State,
    rows: &RecordBatch,
    locations: &[Location],
) -> Result<Vec<RowRef>, StorageError> {
    let table = state.schema.arrow_schema();
    let (in_memory, on_disk): (Vec<usize>, Vec<usize>) =
        (0..locations.len()).partition(|&i| matches!(locations[i], Location::Mem(_)));
    let mut refs = vec![RowRef { batch: 0, row: 0 }; locations.len()];
    if !in_memory.is_empty() {
        let picked = UInt32Array::from_iter_values(in_memory.iter().map(|&i| i as u32));
        let old: Vec<(usize, usize)> = in_memory
            .iter()
            .filter_map(|&i| match locations[i] {
                Location::Mem(r) => Some(state.arena.index(r)),
                _ => None,
            })
            .collect();
        let mut columns = Vec::with_capacity(table.fields().len());
        for (c, field) in table.fields().iter().enumerate() {
            columns.push(match rows.column_by_name(field.name()) {
                Some(new) => take(new, &picked, None)?,
                None => interleave(&state.arena.column_sources(c), &old)?,
            });
        }
        let new = state
            .arena
            .append(RecordBatch::try_new(table.clone(), columns)?);
        for (&i, r) in in_memory.iter().zip(new) {
            refs[i] = r;
        }
    }
    if !on_disk.is_empty() {
        let picked = UInt32Array::from_iter_values(on_disk.iter().map(|&i| i as u32));
        let mut columns = Vec::with_capacity(table.fields().len());
        let mut held = Vec::new();
        for (c, field) in table.fields().iter().enumerate() {
            columns.push(match rows.column_by_name(field.name()) {
                Some(new) => {
                    held.push(c);
                    take(new, &picked, None)?
                }
                None => new_null_array(field.data_type(), on_disk.len()),
            });
        }
        let batch = RecordBatch::try_new(history::nullable(&table), columns)?;
        let new = state.arena.append_partial(batch, held);
        for (&i, r) in on_disk.iter().zip(new) {
            refs[i] = r;
        }
    }
    Ok(refs)
}

/// The rowsets to merge so that key lookups consult fewer rowsets: those whose key ranges
/// cover the key covered by most rowsets, smallest first within `budget` bytes; None if fewer
/// than two.
fn overlapping_rowsets(
    rowsets: &[Arc<DiskRowSet>],
    tree: &RowSetTree,
    budget: u64,
) -> Option<Vec<u64>> {
    // The deepest point is the first key of some rowset.
    let mut best: Vec<usize> = Vec::new();
    for (first, _) in rowsets.iter().filter_map(|r| r.key_bounds()) {
        let covering = tree.covering(first);
        if covering.len() > best.len() {
            best = covering;
        }
    }
    best.sort_by_key(|&i| rowsets[i].disk_bytes());
    let mut total = 0;
    let chosen: Vec<u64> = best
        .into_iter()
        .take_while(|&i| {
            total += rowsets[i].disk_bytes();
            total <= budget
        })
        .map(|i| rowsets[i].id)
        .collect();
    (chosen.len() >= 2).then_some(chosen)
}

/// The interval tree of the rowsets' key ranges.
fn key_ranges(rowsets: &[Arc<DiskRowSet>]) -> RowSetTree {
    RowSetTree::new(rowsets.iter().map(|r| match r.key_bounds() {
        None => (vec![u8::MAX], Vec::new()), // covers nothing
        Some((first, last)) => (first.to_vec(), last.to_vec()),
    }))
}

/// `n` copies of `column`'s DEFAULT, or NULLs without one.
fn default_column(column: &crate::ColumnSchema, n: usize) -> Result<ArrayRef, StorageError> {
    let data_type = column.column_type.arrow_type();
    let Some(text) = &column.default else {
        return Ok(new_null_array(&data_type, n));
    };
    let one = cast(&StringArray::from(vec![text.as_str()]), &data_type)?;
    if one.is_null(0) {
        return Err(StorageError::InvalidSchema(format!(
            "DEFAULT '{text}' of column '{}' is not a {}",
            column.name,
            column.column_type.sql_name()
        )));
    }
    Ok(take(&one, &UInt32Array::from(vec![0u32; n]), None)?)
}

impl State {
    /// The MemRowSet rows visible at `snapshot` (of `mrs` and, for keys without a visible
    /// version there, of `frozen`).
    fn visible_mem_rows(&self, snapshot: Timestamp) -> Vec<RowRef> {
        let mut rows = self.mrs.visible_rows(snapshot);
        if let Some(frozen) = &self.frozen {
            for (key, versions) in &frozen.index {
                let newer = self.mrs.index.get(key).and_then(|v| visible(v, snapshot));
                if newer.is_none() {
                    rows.extend(visible(versions, snapshot).and_then(|v| v.row));
                }
            }
        }
        rows
    }

    /// Undoes a flush's freeze: the frozen MemRowSet's versions go back before the newer ones.
    fn thaw(&mut self) {
        self.frozen_keys_written.clear();
        for d in &mut self.deltas {
            d.thaw();
        }
        if let Some(frozen) = self.frozen.take() {
            let newer = std::mem::take(&mut self.mrs);
            self.mrs = (*frozen).clone();
            self.mrs.append(newer);
        }
    }

    /// The row with `key` visible at `snapshot`, if any (as a scan at `snapshot` sees it):
    /// in the MemRowSet (`rs` is [`IN_MEMROWSET`]), or in rowset `rs` at `ordinal`.
    fn locate_at(
        &self,
        key: &[u8],
        snapshot: Timestamp,
        cache: &KeyCache,
    ) -> Result<Option<(usize, u32, Image)>, StorageError> {
        fn in_memory<'a>(mrs: &'a MemRowSet, key: &[u8], at: Timestamp) -> Option<&'a Version> {
            mrs.index.get(key).and_then(|v| visible(v, at))
        }
        let newest = in_memory(&self.mrs, key, snapshot)
            .or_else(|| in_memory(self.frozen.as_deref()?, key, snapshot));
        if let Some(v) = newest {
            return Ok(v.row.map(|r| (IN_MEMROWSET, 0, Image::Mem(r))));
        }
        // A key deleted from one rowset and inserted again lives in another: at most one of
        // them has it live at any time.
        let hash = crate::diskrowset::hash_bytes(key);
        for rs in self.tree.covering(key) {
            if let Some(ordinal) = self.rowsets[rs].find(key, hash, cache)? {
                match self.deltas[rs].at(ordinal, snapshot)? {
                    Image::Absent => continue,
                    image => return Ok(Some((rs, ordinal, image))),
                }
            }
        }
        Ok(None)
    }

    fn locate(&self, key: &[u8], cache: &KeyCache) -> Result<Location, StorageError> {
        let frozen = || self.frozen.as_ref()?.latest(key);
        if let Some(v) = self.mrs.latest(key).or_else(frozen) {
            return Ok(match v.row {
                Some(r) => Location::Mem(r),
                None => Location::Absent,
            });
        }
        let hash = crate::diskrowset::hash_bytes(key);
        for rs in self.tree.covering(key) {
            if let Some(ordinal) = self.rowsets[rs].find(key, hash, cache)? {
                match self.deltas[rs].latest(ordinal) {
                    Image::Absent => continue,
                    _ => return Ok(Location::Disk { rs, ordinal }),
                }
            }
        }
        Ok(Location::Absent)
    }
}

/// Writes the metadata: a temp file, synced, renamed over the old one, directory synced.
fn write_metadata(
    dir: &Path,
    meta: &Metadata,
    fail: &dyn Fn(&str) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let json = serde_json::to_vec(meta).map_err(|e| StorageError::Corruption(e.to_string()))?;
    let tmp = dir.join("metadata.tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(format!("{:08x}\n", crc32fast::hash(&json)).as_bytes())?;
    file.write_all(&json)?;
    file.sync_all()?;
    fail("metadata_staged")?;
    std::fs::rename(&tmp, dir.join(METADATA))?;
    File::open(dir)?.sync_all()?;
    fail("metadata_switched")
}

fn read_metadata(dir: &Path) -> Result<Metadata, StorageError> {
    let path = dir.join(METADATA);
    let bytes = std::fs::read(&path)?;
    let bad = || StorageError::Corruption(format!("{} is damaged", path.display()));
    let (crc, json) = bytes.split_at_checked(9).ok_or_else(bad)?;
    let crc = std::str::from_utf8(&crc[..8])
        .ok()
        .and_then(|s| u32::from_str_radix(s, 16).ok())
        .ok_or_else(bad)?;
    if crc32fast::hash(json) != crc {
        return Err(bad());
    }
    serde_json::from_slice(json).map_err(|_| bad())
}
