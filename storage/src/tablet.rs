//! The tablet: a MemRowSet, DiskRowSets with their delta stores, and the metadata that ties them.
//!
//! Writes are applied by the Raft thread in log order ([`Tablet::apply`]); each write batch is
//! validated completely before anything changes, so it applies entirely or not at all, and the
//! outcome depends only on the tablet's state and the batch (replicas and replays agree).
//!
//! Flushing writes the MemRowSet's live rows as new DiskRowSets, rewrites rowsets that have
//! deltas with those deltas applied, and then switches to the new set of files by replacing
//! `metadata` atomically (temp file, fsync, rename, fsync directory). The metadata records
//! `durable_index`, the last log entry whose effects the files contain; the WAL is replayed from
//! there. Files the metadata does not name (left by a crash mid-flush) are deleted on open.
//! Base data carries no history: a snapshot older than the last flush sees the flushed state.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{cast, interleave, take};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::deltastore::DeltaMemStore;
use crate::diskrowset::DiskRowSet;
use crate::key::{encode_keys, format_key};
use crate::memrowset::{visible, MemRowSet, RowArena, RowRef, Version};
use crate::scan::{self, ScanIterator, ScanSpec, Source};
use crate::ColumnType;
use crate::{Schema, StorageError, Timestamp, WriteBatch, WriteKind};
use arrow::array::AsArray;

#[derive(Clone, Debug)]
pub struct TabletOptions {
    /// MemRowSet + delta memory at which the tablet asks to be flushed.
    pub flush_threshold_bytes: usize,
    /// Target size of one DiskRowSet.
    pub rowset_target_bytes: usize,
    /// For crash tests: called at each step of a flush or schema change; `true` makes that step
    /// fail as if the process had died there (what is on disk stays as it is).
    pub fail_point: Option<FailPoint>,
}

/// See [`TabletOptions::fail_point`]. Steps: `rowset_written`, `metadata_staged` (the new
/// metadata written but not yet renamed into place) and `metadata_switched`.
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
            fail_point: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Metadata {
    schema: Schema,
    rowsets: Vec<u64>,
    next_rowset_id: u64,
    durable_index: u64,
    /// Above every auto_incrementing_id written so far.
    #[serde(default)]
    next_auto_id: i64,
}

const METADATA: &str = "metadata";

pub struct Tablet {
    dir: PathBuf,
    options: TabletOptions,
    state: RwLock<State>,
}

struct State {
    /// The schema of every row in the MemRowSet, the arena and the rowsets.
    schema: Arc<Schema>,
    arena: RowArena,
    mrs: MemRowSet,
    rowsets: Vec<Arc<DiskRowSet>>,
    /// Parallel to `rowsets`.
    deltas: Vec<DeltaMemStore>,
    next_rowset_id: u64,
    last_applied: u64,
    durable_index: u64,
    next_auto_id: i64,
}

/// Where the live version of a key is.
enum Location {
    Absent,
    Mem(RowRef),
    /// In rowset `rs` at `ordinal`; `image` is its newest delta image (None: the base row).
    Disk {
        rs: usize,
        ordinal: u32,
        image: Option<RowRef>,
    },
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
            next_rowset_id: 1,
            durable_index: 0,
            next_auto_id: 1,
        };
        write_metadata(dir, &meta, &|_| Ok(()))?;
        Ok(Tablet {
            dir: dir.to_path_buf(),
            options,
            state: RwLock::new(State {
                schema: Arc::new(schema),
                arena: RowArena::default(),
                mrs: MemRowSet::default(),
                rowsets: vec![],
                deltas: vec![],
                next_rowset_id: 1,
                last_applied: 0,
                durable_index: 0,
                next_auto_id: 1,
            }),
        })
    }

    pub fn open(dir: &Path, options: TabletOptions) -> Result<Tablet, StorageError> {
        let meta = read_metadata(dir)?;
        let mut rowsets = Vec::new();
        let mut names = HashSet::new();
        for &id in &meta.rowsets {
            names.insert(DiskRowSet::file_name(id));
            rowsets.push(Arc::new(DiskRowSet::open(dir, id)?));
        }
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name != METADATA && !names.contains(&name) {
                tracing::info!(file = %entry.path().display(), "removing file left by an interrupted flush");
                std::fs::remove_file(entry.path())?;
            }
        }
        let deltas = vec![DeltaMemStore::default(); rowsets.len()];
        Ok(Tablet {
            dir: dir.to_path_buf(),
            options,
            state: RwLock::new(State {
                schema: Arc::new(meta.schema),
                arena: RowArena::default(),
                mrs: MemRowSet::default(),
                rowsets,
                deltas,
                next_rowset_id: meta.next_rowset_id,
                last_applied: meta.durable_index,
                durable_index: meta.durable_index,
                next_auto_id: meta.next_auto_id.max(1),
            }),
        })
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
        s.arena.bytes() + s.mrs.bytes()
    }

    pub fn needs_flush(&self) -> bool {
        self.memory_bytes() >= self.options.flush_threshold_bytes
    }

    /// Rows in the MemRowSet and the DiskRowSets, counting deleted and updated rows too.
    pub fn estimated_rows(&self) -> usize {
        let state = self.state.read();
        state.mrs.len() + state.rowsets.iter().map(|r| r.num_rows()).sum::<usize>()
    }

    /// Memory the DiskRowSets hold for key lookups (packed keys and bloom filters).
    pub fn key_index_bytes(&self) -> usize {
        self.state
            .read()
            .rowsets
            .iter()
            .map(|r| r.key_index_bytes())
            .sum()
    }

    pub fn rowset_count(&self) -> usize {
        self.state.read().rowsets.len()
    }

    pub fn disk_bytes(&self) -> u64 {
        self.state
            .read()
            .rowsets
            .iter()
            .map(|r| r.disk_bytes())
            .sum()
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
            let location = state.locate(key);
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
            WriteKind::Update => {
                let merged = self.updated_rows(state, &rows, &locations)?;
                Some(state.arena.append(merged))
            }
            WriteKind::Delete => None,
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
                Location::Disk { rs, ordinal, .. } => state.deltas[rs].push(ordinal, version),
                Location::Mem(_) | Location::Absent => state.mrs.push(key, version),
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

    /// Full rows for an UPDATE: each target row's current image with the batch's columns over it.
    fn updated_rows(
        &self,
        state: &State,
        rows: &RecordBatch,
        locations: &[Location],
    ) -> Result<RecordBatch, StorageError> {
        let table = state.schema.arrow_schema();
        let width = table.fields().len();
        // Base rows of flushed rows without a delta image are read from their rowsets.
        let mut base_reads: Vec<Vec<u32>> = vec![Vec::new(); state.rowsets.len()];
        for l in locations {
            if let Location::Disk {
                rs,
                ordinal,
                image: None,
            } = l
            {
                base_reads[*rs].push(*ordinal);
            }
        }
        let mut base_batches: Vec<(usize, Vec<u32>, RecordBatch)> = Vec::new();
        for (rs, mut ordinals) in base_reads.into_iter().enumerate() {
            if ordinals.is_empty() {
                continue;
            }
            ordinals.sort_unstable();
            ordinals.dedup();
            let batch = state.rowsets[rs].read_rows(width, &ordinals)?;
            base_batches.push((rs, ordinals, batch));
        }
        // Sources for interleave: arena batches, then the base reads.
        let arena_len = state.arena.len();
        let mut indices = Vec::with_capacity(locations.len());
        for l in locations {
            indices.push(match l {
                Location::Mem(r) | Location::Disk { image: Some(r), .. } => {
                    (r.batch as usize, r.row as usize)
                }
                Location::Disk {
                    rs,
                    ordinal,
                    image: None,
                } => {
                    let (pos, (_, ordinals, _)) = base_batches
                        .iter()
                        .enumerate()
                        .find(|(_, (r, _, _))| r == rs)
                        .ok_or_else(|| StorageError::Corruption("base row not read".into()))?;
                    let row = ordinals
                        .binary_search(ordinal)
                        .map_err(|_| StorageError::Corruption("base row not read".into()))?;
                    (arena_len + pos, row)
                }
                Location::Absent => {
                    return Err(StorageError::Corruption("update of an absent row".into()))
                }
            });
        }
        let mut columns = Vec::with_capacity(width);
        for (c, field) in table.fields().iter().enumerate() {
            if let Some(new) = rows.column_by_name(field.name()) {
                columns.push(new.clone());
                continue;
            }
            let mut sources: Vec<&dyn Array> = (0..arena_len as u32)
                .map(|b| state.arena.batch(b).column(c).as_ref())
                .collect();
            sources.extend(base_batches.iter().map(|(_, _, b)| b.column(c).as_ref()));
            columns.push(interleave(&sources, &indices)?);
        }
        Ok(RecordBatch::try_new(table, columns)?)
    }

    pub fn scan(&self, spec: &ScanSpec) -> Result<ScanIterator, StorageError> {
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
            let (hidden, images) = deltas.view(spec.snapshot);
            sources.push_back(Source::Rowset(Box::new(rowset.reader(
                schema,
                &read_columns,
                &hidden,
                &spec.predicates,
                batch_size,
            )?)));
            for chunk in images.chunks(batch_size) {
                sources.push_back(Source::Batch(state.arena.gather(
                    &table,
                    &read_columns,
                    chunk,
                )?));
            }
        }
        let mem_rows = state.mrs.visible_rows(spec.snapshot);
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
        let width = table.fields().len();
        let mut sources = std::collections::VecDeque::new();
        let mut in_memory = Vec::new();
        for key in keys {
            match state.locate_at(&key, spec.snapshot) {
                Some(Found::Memory(row)) => in_memory.push(row),
                Some(Found::Disk { rs, ordinal }) => {
                    let row = state.rowsets[rs].read_rows(width, &[ordinal])?;
                    sources.push_back(Source::Batch(row.project(&read_columns)?));
                }
                None => {}
            }
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

    /// Writes in-memory rows and deltas to new DiskRowSets and switches to them atomically.
    pub fn flush(&self) -> Result<(), StorageError> {
        self.flush_locked(&mut self.state.write())
    }

    /// Changes the schema as log entry `index`: flushes, rewrites every rowset with the new
    /// columns (values found by column id; an added column takes its DEFAULT or NULL), then
    /// switches to the new schema and files with one metadata write. A crash before that write
    /// leaves the old schema and files, and replaying the log applies the change again.
    pub fn alter_schema(&self, index: u64, schema: &Schema) -> Result<(), StorageError> {
        let mut state = self.state.write();
        let old = state.schema.clone();
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
        self.flush_locked(&mut state)?;
        let table = schema.arrow_schema();
        let mut new = NewRowsets::starting_at(state.next_rowset_id);
        let result = (|| -> Result<(), StorageError> {
            for rowset in &state.rowsets {
                let n = rowset.num_rows();
                let base =
                    rowset.read_rows(old.columns().len(), &(0..n as u32).collect::<Vec<_>>())?;
                let columns = schema
                    .columns()
                    .iter()
                    .zip(&sources)
                    .map(|(column, source)| match source {
                        Some(o) => Ok(base.column(*o).clone()),
                        None => default_column(column, n),
                    })
                    .collect::<Result<Vec<_>, StorageError>>()?;
                let batch = RecordBatch::try_new(table.clone(), columns)?;
                let keys = (0..n as u32).map(|o| rowset.key(o).to_vec()).collect();
                new.write(self, schema, &[batch], keys)?;
            }
            Ok(())
        })();
        let (created, next_id) = new.finish(&mut state, result)?;
        // From here the new files may be named by the metadata on disk: they stay.
        self.write_metadata(&Metadata {
            schema: schema.clone(),
            rowsets: created.iter().map(|r| r.id).collect(),
            next_rowset_id: next_id,
            durable_index: index,
            next_auto_id: state.next_auto_id,
        })?;
        for rowset in &state.rowsets {
            if let Err(e) = std::fs::remove_file(rowset.path()) {
                tracing::warn!(file = %rowset.path().display(), error = %e, "could not remove rewritten rowset");
            }
        }
        state.schema = Arc::new(schema.clone());
        state.deltas = vec![DeltaMemStore::default(); created.len()];
        state.rowsets = created;
        state.next_rowset_id = next_id;
        state.last_applied = state.last_applied.max(index);
        state.durable_index = index;
        Ok(())
    }

    fn flush_locked(&self, state: &mut State) -> Result<(), StorageError> {
        if state.mrs.is_empty() && state.deltas.iter().all(DeltaMemStore::is_empty) {
            if state.durable_index != state.last_applied {
                let meta = Metadata {
                    schema: (*state.schema).clone(),
                    rowsets: state.rowsets.iter().map(|r| r.id).collect(),
                    next_rowset_id: state.next_rowset_id,
                    durable_index: state.last_applied,
                    next_auto_id: state.next_auto_id,
                };
                self.write_metadata(&meta)?;
                state.durable_index = state.last_applied;
            }
            return Ok(());
        }
        let table = state.schema.arrow_schema();
        let all: Vec<usize> = (0..table.fields().len()).collect();
        let mut new = NewRowsets::starting_at(state.next_rowset_id);
        let mut kept: Vec<Arc<DiskRowSet>> = Vec::new();
        let mut replaced: Vec<Arc<DiskRowSet>> = Vec::new();
        let latest = Timestamp(u64::MAX);
        let result = (|| -> Result<(), StorageError> {
            // Rowsets with deltas: rewritten with their deltas applied.
            for (rowset, deltas) in state.rowsets.iter().zip(&state.deltas) {
                if deltas.is_empty() {
                    kept.push(rowset.clone());
                    continue;
                }
                let (hidden, _) = deltas.view(latest);
                let hidden: HashSet<u32> = hidden.into_iter().collect();
                let mut keys: Vec<(Vec<u8>, Option<RowRef>, u32)> = Vec::new();
                for ordinal in 0..rowset.num_rows() as u32 {
                    if !hidden.contains(&ordinal) {
                        keys.push((rowset.key(ordinal).to_vec(), None, ordinal));
                    } else if let Some(Version { row: Some(r), .. }) = deltas.latest(ordinal) {
                        keys.push((rowset.key(ordinal).to_vec(), Some(*r), ordinal));
                    }
                }
                let base = rowset.read_rows(
                    all.len(),
                    &(0..rowset.num_rows() as u32).collect::<Vec<_>>(),
                )?;
                let arena_len = state.arena.len();
                let indices: Vec<(usize, usize)> = keys
                    .iter()
                    .map(|(_, image, ordinal)| match image {
                        Some(r) => (r.batch as usize, r.row as usize),
                        None => (arena_len, *ordinal as usize),
                    })
                    .collect();
                let mut columns = Vec::new();
                for c in 0..all.len() {
                    let mut sources: Vec<&dyn Array> = (0..arena_len as u32)
                        .map(|b| state.arena.batch(b).column(c).as_ref())
                        .collect();
                    sources.push(base.column(c).as_ref());
                    columns.push(interleave(&sources, &indices)?);
                }
                replaced.push(rowset.clone());
                if keys.is_empty() {
                    continue;
                }
                let batch = RecordBatch::try_new(table.clone(), columns)?;
                new.write(
                    self,
                    &state.schema,
                    &[batch],
                    keys.into_iter().map(|k| k.0).collect(),
                )?;
            }
            // MemRowSet: live rows in key order, rolled at the target rowset size.
            let live: Vec<(Vec<u8>, RowRef)> = state
                .mrs
                .index
                .iter()
                .filter_map(|(k, v)| v.last().and_then(|v| v.row).map(|r| (k.clone(), r)))
                .collect();
            if !live.is_empty() {
                let row_bytes = (state.arena.bytes() / live.len().max(1)).max(1);
                let rows_per_rowset = (self.options.rowset_target_bytes / row_bytes).max(1024);
                for chunk in live.chunks(rows_per_rowset) {
                    let refs: Vec<RowRef> = chunk.iter().map(|(_, r)| *r).collect();
                    let mut batches = Vec::new();
                    for part in refs.chunks(64 * 1024) {
                        batches.push(state.arena.gather(&table, &all, part)?);
                    }
                    let keys = chunk.iter().map(|(k, _)| k.clone()).collect();
                    new.write(self, &state.schema, &batches, keys)?;
                }
            }
            Ok(())
        })();
        let (created, next_id) = new.finish(state, result)?;
        let mut rowsets = kept;
        rowsets.extend(created);
        let meta = Metadata {
            schema: (*state.schema).clone(),
            rowsets: rowsets.iter().map(|r| r.id).collect(),
            next_rowset_id: next_id,
            durable_index: state.last_applied,
            next_auto_id: state.next_auto_id,
        };
        self.write_metadata(&meta)?;
        // The new state is durable; the replaced files are garbage now (open scans keep their
        // file handles).
        for rowset in replaced {
            if let Err(e) = std::fs::remove_file(rowset.path()) {
                tracing::warn!(file = %rowset.path().display(), error = %e, "could not remove replaced rowset");
            }
        }
        state.deltas = vec![DeltaMemStore::default(); rowsets.len()];
        state.rowsets = rowsets;
        state.next_rowset_id = next_id;
        state.durable_index = state.last_applied;
        state.mrs.clear();
        state.arena.clear();
        Ok(())
    }
}

/// The rowsets a flush or schema change writes: ids handed out in order, files removed if the
/// operation fails before its metadata is written.
struct NewRowsets {
    next_id: u64,
    created: Vec<Arc<DiskRowSet>>,
}

impl NewRowsets {
    fn starting_at(next_id: u64) -> Self {
        Self {
            next_id,
            created: Vec::new(),
        }
    }

    fn write(
        &mut self,
        tablet: &Tablet,
        schema: &Schema,
        batches: &[RecordBatch],
        keys: Vec<Vec<u8>>,
    ) -> Result<(), StorageError> {
        let rowset = DiskRowSet::write(&tablet.dir, self.next_id, schema, batches, keys)?;
        self.created.push(Arc::new(rowset));
        self.next_id += 1;
        tablet.fail("rowset_written")
    }

    /// Ends the writing: the ids handed out stay used in `state` (the metadata on disk may name
    /// them even after a failure); if `written` failed, the new files are removed. Returns the
    /// new rowsets and the next free id.
    fn finish(
        self,
        state: &mut State,
        written: Result<(), StorageError>,
    ) -> Result<(Vec<Arc<DiskRowSet>>, u64), StorageError> {
        state.next_rowset_id = self.next_id;
        if let Err(e) = written {
            for rowset in &self.created {
                let _ = std::fs::remove_file(rowset.path());
            }
            return Err(e);
        }
        Ok((self.created, self.next_id))
    }
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

/// Where the version of a key visible at a snapshot is.
enum Found {
    Memory(RowRef),
    Disk { rs: usize, ordinal: u32 },
}

impl State {
    /// The row with `key` visible at `snapshot`, if any (as a scan at `snapshot` sees it).
    fn locate_at(&self, key: &[u8], snapshot: Timestamp) -> Option<Found> {
        if let Some(v) = self
            .mrs
            .index
            .get(key)
            .and_then(|versions| visible(versions, snapshot))
        {
            return v.row.map(Found::Memory);
        }
        let hash = crate::diskrowset::hash_bytes(key);
        for (rs, rowset) in self.rowsets.iter().enumerate() {
            if let Some(ordinal) = rowset.find(key, hash) {
                return match self.deltas[rs]
                    .by_ordinal
                    .get(&ordinal)
                    .and_then(|versions| visible(versions, snapshot))
                {
                    Some(v) => v.row.map(Found::Memory),
                    None => Some(Found::Disk { rs, ordinal }),
                };
            }
        }
        None
    }

    fn locate(&self, key: &[u8]) -> Location {
        if let Some(v) = self.mrs.latest(key) {
            return match v.row {
                Some(r) => Location::Mem(r),
                None => Location::Absent,
            };
        }
        let hash = crate::diskrowset::hash_bytes(key);
        for (rs, rowset) in self.rowsets.iter().enumerate() {
            if let Some(ordinal) = rowset.find(key, hash) {
                return match self.deltas[rs].latest(ordinal) {
                    None => Location::Disk {
                        rs,
                        ordinal,
                        image: None,
                    },
                    Some(Version { row: Some(r), .. }) => Location::Disk {
                        rs,
                        ordinal,
                        image: Some(*r),
                    },
                    Some(Version { row: None, .. }) => Location::Absent,
                };
            }
        }
        Location::Absent
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
