//! The write path: a batch is validated completely (columns, types, lengths, NULLs, and every
//! key against the tablet's state) before anything changes, so it applies entirely or not at
//! all, and its outcome depends only on the tablet's state and the batch: replicas applying the
//! same log agree, and a replay after a crash does what the first apply did.
//!
//! A key's live version is in exactly one place (see [`Location`]): rows in the MemRowSet get
//! new versions there, rows in a DiskRowSet get them in that rowset's DeltaMemStore, keyed by
//! ordinal. An UPDATE of a flushed row stores only the columns it sets, so it reads no row from
//! disk.

use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array,
};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, Field, FieldRef, Schema as ArrowSchema};

use super::{State, Tablet};
use crate::delta::Image;
use crate::history;
use crate::key::{encode_keys, format_key, row_keys, KeyBytes, SeenKeys};
use crate::memrowset::{RowRef, Version};
use crate::{ColumnType, PageCache};
use crate::{Schema, StorageError, Timestamp, WriteBatch, WriteKind, WriteOutcome};

/// Where the live version of a key is.
pub(super) enum Location {
    Absent,
    Mem(RowRef),
    /// In rowset `rs` at `ordinal`.
    Disk {
        rs: usize,
        ordinal: u32,
    },
}

impl Tablet {
    /// Applies one write batch at `ts` as log entry `index`: all rows or none. Returns the
    /// number of rows applied.
    pub fn apply(
        &self,
        index: u64,
        ts: Timestamp,
        batch: &WriteBatch,
    ) -> Result<usize, StorageError> {
        self.apply_write(index, ts, batch)
            .map(|outcome| outcome.rows)
    }

    /// [`Self::apply`], also reporting the rows of a conditional batch (`unchanged_since`)
    /// whose key changed after its snapshot: if there is any, nothing is applied.
    pub fn apply_write(
        &self,
        index: u64,
        ts: Timestamp,
        batch: &WriteBatch,
    ) -> Result<WriteOutcome, StorageError> {
        let mut state = self.state.write();
        state.last_applied = state.last_applied.max(index);
        let schema = state.schema.clone();
        match queue_write(&schema, batch.kind)? {
            QueueWrite::Insert => {
                // Rows inserted now would take positions above those of a transaction
                // committing below `ts`, yet become visible before them: they take their turn.
                if state.waits_for_turn(ts) {
                    let rows = waiting_queue_rows(&schema, &batch.rows, batch.kind)?;
                    let rows = WriteBatch::new(batch.kind, rows);
                    return Ok(self.insert_in_turn(&mut state, index, ts, rows));
                }
                let entry = state.entry_position(index);
                let rows = with_positions(&schema, &batch.rows, entry, 0, true)?;
                let batch = WriteBatch {
                    rows,
                    ..batch.clone()
                };
                self.apply_locked(&mut state, ts, &batch)
            }
            QueueWrite::Other => self.apply_locked(&mut state, ts, batch),
        }
    }

    fn apply_locked(
        &self,
        state: &mut State,
        ts: Timestamp,
        batch: &WriteBatch,
    ) -> Result<WriteOutcome, StorageError> {
        let schema = state.schema.clone();
        let rows = Self::conform(&schema, batch)?;
        let (rows, conflicts) = match batch.unchanged_since {
            Some(snapshot) if matches!(batch.kind, WriteKind::Update | WriteKind::Delete) => {
                self.without_conflicts(state, rows, snapshot)?
            }
            _ => {
                let keys = match state.locks.is_empty() {
                    true => Vec::new(),
                    false => encode_keys(&schema, &rows)?,
                };
                if let Some(row) = state.locked_row(&keys) {
                    return Err(StorageError::Locked {
                        key: format_key(&schema, &rows, row),
                    });
                }
                (rows, Vec::new())
            }
        };
        if !conflicts.is_empty() {
            return Ok(WriteOutcome {
                rows: 0,
                conflicts,
                visible_at: None,
            });
        }
        let rows = self.apply_rows(state, ts, batch.kind, rows, false)?;
        Ok(WriteOutcome {
            rows,
            conflicts,
            visible_at: Some(ts),
        })
    }

    /// `rows` without those whose key changed after `snapshot`, is gone or is locked by a
    /// pending transaction, and the indices of those.
    fn without_conflicts(
        &self,
        state: &State,
        rows: RecordBatch,
        snapshot: Timestamp,
    ) -> Result<(RecordBatch, Vec<u32>), StorageError> {
        let keys = encode_keys(&state.schema, &rows)?;
        let mut conflicts = Vec::new();
        for (row, key) in keys.iter().enumerate() {
            if state.locks.contains_key(key)
                || state.changed_after(key, snapshot, &self.options.page_cache)?
            {
                conflicts.push(row as u32);
            }
        }
        if conflicts.is_empty() {
            return Ok((rows, conflicts));
        }
        let mut keep = vec![true; rows.num_rows()];
        for &row in &conflicts {
            keep[row as usize] = false;
        }
        let rows = arrow::compute::filter_record_batch(&rows, &keep.into())?;
        Ok((rows, conflicts))
    }

    /// Applies `rows` at `ts`, checked against the tablet's state first. `absent`: their keys
    /// are known to be absent (new rows a committing transaction checked when it wrote them
    /// and has held locked since), so they are not looked up again.
    pub(super) fn apply_rows(
        &self,
        state: &mut State,
        ts: Timestamp,
        kind: WriteKind,
        rows: RecordBatch,
        absent: bool,
    ) -> Result<usize, StorageError> {
        let schema = state.schema.clone();
        let n = rows.num_rows();
        if n == 0 {
            return Ok(0);
        }
        if let (Some(c), WriteKind::Insert | WriteKind::InsertIgnore) =
            (schema.auto_increment_column(), kind)
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
        let keys: Vec<KeyBytes> = row_keys(&schema, &rows)?;
        // Validate every row before changing anything.
        let mut seen = SeenKeys::new(&keys);
        let mut locations = Vec::with_capacity(n);
        // Rows not applied: superseded by a later image of their key (UPSERT), or skipped
        // because their key exists or came earlier in the batch (INSERT IGNORE).
        let mut applied = vec![true; n];
        // A queue's new rows have positions no row ever had (log indexes are not reused), so
        // their keys need no lookup.
        let fresh = schema.position_column().is_some()
            && matches!(kind, WriteKind::Insert | WriteKind::InsertIgnore);
        let known_absent = fresh || (absent && matches!(kind, WriteKind::Insert));
        for (row, key) in keys.iter().enumerate() {
            if known_absent {
                locations.push(Location::Absent);
                continue;
            }
            if !seen.first(&key[..]) {
                match kind {
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
            let location = state.locate(key, &self.options.page_cache)?;
            match (kind, &location) {
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
        // New rows whose arena batch holds only rows new to the MemRowSet, all applied, can be
        // read by scans as the batch they are; rows put in among others cannot (see
        // `MemRowSet::whole_batches`). (Other versions of keys there end it in `push`.)
        let inserts = matches!(
            kind,
            WriteKind::Insert | WriteKind::InsertIgnore | WriteKind::Upsert
        );
        let in_memory = |(a, l): (&bool, &Location)| *a && !matches!(l, Location::Disk { .. });
        let whole =
            applied.iter().all(|&a| a) && locations.iter().all(|l| matches!(l, Location::Absent));
        let some_in_memory = applied.iter().zip(&locations).any(in_memory);
        let first_batch = state.arena.end();
        // New full row images: the batch's rows for INSERT/UPSERT, old rows with the changed
        // columns replaced for UPDATE, none for DELETE.
        let images: Option<Vec<RowRef>> = match kind {
            WriteKind::Insert | WriteKind::InsertIgnore | WriteKind::Upsert => {
                Some(state.arena.append(rows.clone()))
            }
            WriteKind::Update => Some(updated_rows(state, &rows, &locations)?),
            WriteKind::Delete => None,
        };
        // The columns a change of a flushed row may change: those the UPDATE sets, all but
        // the key for an UPSERT, none for a DELETE (a deletion changes no column).
        let changed: Vec<u32> = match kind {
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
                    // (A fresh position is in no frozen MemRowSet either.)
                    let frozen = state.frozen.as_ref().filter(|_| !fresh);
                    if frozen.is_some_and(|f| f.index.contains_key(&key))
                        && !state.mrs.index.contains_key(&key)
                    {
                        state.frozen_keys_written.push(key.clone());
                    }
                    state.mrs.push(key, version)
                }
            }
        }
        match (inserts, whole) {
            (true, true) => state.mrs.inserted_whole(first_batch),
            (true, false) if some_in_memory => state.mrs.inserted_part(),
            _ => {}
        }
        if kind == WriteKind::InsertIgnore {
            return Ok(applied.iter().filter(|&&a| a).count());
        }
        Ok(n)
    }

    /// Checks a batch's columns against the schema and returns it in the shape the kind needs:
    /// full table rows for INSERT/UPSERT, key + changed columns for UPDATE, keys for DELETE.
    pub(super) fn conform(
        schema: &Schema,
        batch: &WriteBatch,
    ) -> Result<RecordBatch, StorageError> {
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
            } else if same_values(column.data_type(), field.data_type()) {
                cast(column, field.data_type())?
            } else {
                return Err(StorageError::SchemaMismatch(format!(
                    "column '{}' is {}, got {}",
                    field.name(),
                    schema.columns()[c].column_type.sql_name(),
                    column.data_type()
                )));
            };
            let varchar = match &schema.columns()[c].column_type {
                ColumnType::Varchar { length } => Some((*length, column.clone())),
                ColumnType::Array(element) => match **element {
                    ColumnType::Varchar { length } => Some((length, list_values(&column))),
                    _ => None,
                },
                _ => None,
            };
            if let Some((limit, strings)) = varchar {
                let longest = strings
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
            if schema.columns()[c].column_type == ColumnType::Json {
                let values = column.as_string::<i32>();
                for (row, value) in values.iter().enumerate() {
                    let Some(value) = value else { continue };
                    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(value) {
                        return Err(StorageError::InvalidJson {
                            column: field.name().clone(),
                            key: crate::key::format_key(schema, rows, row),
                            message: e.to_string(),
                        });
                    }
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
}

/// Whether a column of Arrow type `given` holds values of a table column of type `table` that a
/// cast passes on unchanged: timestamps in another time zone, lists whose element field is
/// named otherwise (Parquet's `element`, Arrow's `item`) or nullable otherwise.
fn same_values(given: &DataType, table: &DataType) -> bool {
    match (given, table) {
        (DataType::Timestamp(u1, _), DataType::Timestamp(u2, _)) => u1 == u2,
        (DataType::List(a), DataType::List(b)) => a.data_type() == b.data_type(),
        _ => false,
    }
}

/// The element values of the lists in `column` (a list array), from the first list's to the
/// last one's.
fn list_values(column: &ArrayRef) -> ArrayRef {
    let lists = column.as_list::<i32>();
    let offsets = lists.value_offsets();
    let (first, last) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
    lists.values().slice(first, last - first)
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
        let old: Vec<RowRef> = in_memory
            .iter()
            .filter_map(|&i| match locations[i] {
                Location::Mem(r) => Some(r),
                _ => None,
            })
            .collect();
        // The columns the update leaves as they were, gathered from the batches the old images
        // are in (not from every batch of the arena).
        let kept: Vec<usize> = (0..table.fields().len())
            .filter(|&c| rows.column_by_name(table.field(c).name()).is_none())
            .collect();
        let old = state.arena.gather(&table, &kept, &old)?;
        let mut kept_columns = old.columns().iter().cloned();
        let mut columns = Vec::with_capacity(table.fields().len());
        for field in table.fields() {
            columns.push(match rows.column_by_name(field.name()) {
                Some(new) => take(new, &picked, None)?,
                // `kept` lists exactly these columns, in this order.
                None => kept_columns
                    .next()
                    .unwrap_or_else(|| new_null_array(field.data_type(), 0)),
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

impl State {
    /// Whether the row with `key` has a version newer than `snapshot`, or no live version (see
    /// [`crate::delta::RowsetDeltas::changed_after`] for rows on disk).
    pub(super) fn changed_after(
        &self,
        key: &[u8],
        snapshot: Timestamp,
        cache: &PageCache,
    ) -> Result<bool, StorageError> {
        let frozen = || self.frozen.as_ref()?.latest(key);
        if let Some(v) = self.mrs.latest(key).or_else(frozen) {
            return Ok(v.ts > snapshot || v.row.is_none());
        }
        let hash = crate::diskrowset::hash_bytes(key);
        for rs in self.tree.covering(key) {
            if let Some(ordinal) = self.rowsets[rs].find(key, hash, cache)? {
                match self.deltas[rs].latest(ordinal) {
                    Image::Absent => continue,
                    _ => return Ok(self.deltas[rs].changed_after(ordinal, snapshot)),
                }
            }
        }
        Ok(true)
    }

    /// Whether the row with `key` has a version (an insert, update or delete) newer than
    /// `snapshot`; a key never written is not. May answer yes for a row on disk that did not
    /// change (see [`crate::delta::RowsetDeltas::changed_after`]), never no for one that did.
    pub(super) fn written_after(
        &self,
        key: &[u8],
        snapshot: Timestamp,
        cache: &PageCache,
    ) -> Result<bool, StorageError> {
        let frozen = || self.frozen.as_ref()?.latest(key);
        if let Some(v) = self.mrs.latest(key).or_else(frozen) {
            return Ok(v.ts > snapshot);
        }
        let hash = crate::diskrowset::hash_bytes(key);
        for rs in self.tree.covering(key) {
            if let Some(ordinal) = self.rowsets[rs].find(key, hash, cache)? {
                if self.deltas[rs].changed_after(ordinal, snapshot) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    pub(super) fn locate(&self, key: &[u8], cache: &PageCache) -> Result<Location, StorageError> {
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

/// Bits of a position that count rows within one log entry: position = (index << 24) + row.
pub const POSITION_ROW_BITS: u32 = 24;

/// What a write to a table with a POSITION column (a queue table) is.
pub(super) enum QueueWrite {
    /// New rows, which take positions when they are applied.
    Insert,
    /// Anything else (also every write to other tables).
    Other,
}

/// What a write of `kind` is in a table of `schema`; an error for an UPSERT into a queue table
/// (a row's position is its key: a new row takes a new one, so UPSERT could only insert).
pub(super) fn queue_write(schema: &Schema, kind: WriteKind) -> Result<QueueWrite, StorageError> {
    match (schema.position_column(), kind) {
        (None, _) => Ok(QueueWrite::Other),
        (Some(_), WriteKind::Insert | WriteKind::InsertIgnore) => Ok(QueueWrite::Insert),
        (Some(c), WriteKind::Upsert) => Err(StorageError::SchemaMismatch(format!(
            "UPSERT cannot write a table whose column '{}' is GENERATED ALWAYS AS POSITION: \
             INSERT adds rows, UPDATE changes them",
            schema.columns()[c].name
        ))),
        (Some(_), WriteKind::Update | WriteKind::Delete) => Ok(QueueWrite::Other),
    }
}

/// New rows of a queue table that wait before they are applied (in a transaction, or for their
/// turn): checked as an insert of `kind` is, with positions only held in place.
pub(super) fn waiting_queue_rows(
    schema: &Schema,
    rows: &RecordBatch,
    kind: WriteKind,
) -> Result<RecordBatch, StorageError> {
    let rows = with_positions(schema, rows, 0, 0, true)?;
    Tablet::conform(schema, &WriteBatch::new(kind, rows))
}

/// `rows`, inserted into a queue table by a log entry whose first position is `entry` (see
/// [`super::State::entry_position`]), with their positions: `entry + first + i`, increasing in
/// log order within the tablet, the same on every replica and after every replay. With
/// `fresh`, the rows must leave the position NULL.
pub(super) fn with_positions(
    schema: &Schema,
    rows: &RecordBatch,
    entry: u64,
    first: u64,
    fresh: bool,
) -> Result<RecordBatch, StorageError> {
    let Some(c) = schema.position_column() else {
        return Ok(rows.clone());
    };
    let name = &schema.columns()[c].name;
    let n = rows.num_rows() as u64;
    if first + n > 1 << POSITION_ROW_BITS {
        return Err(StorageError::SchemaMismatch(format!(
            "one write inserts at most {} rows into a queue table",
            1u64 << POSITION_ROW_BITS
        )));
    }
    let base = entry + first;
    let positions: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (base..base + n).map(|p| p as i64),
    ));
    let mut fields: Vec<FieldRef> = rows.schema().fields().iter().cloned().collect();
    let mut columns = rows.columns().to_vec();
    match fields.iter().position(|f| f.name() == name) {
        Some(i) => {
            if fresh && columns[i].null_count() != rows.num_rows() {
                return Err(StorageError::SchemaMismatch(format!(
                    "column '{name}' is GENERATED ALWAYS AS POSITION: the database assigns \
                     it, so leave it out of INSERT"
                )));
            }
            fields[i] = Arc::new(Field::new(name, DataType::Int64, false));
            columns[i] = positions;
        }
        None => {
            fields.push(Arc::new(Field::new(name, DataType::Int64, false)));
            columns.push(positions);
        }
    }
    Ok(RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns,
    )?)
}
