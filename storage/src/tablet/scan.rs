//! Scans of a tablet: the MemRowSet's visible rows and, per DiskRowSet, a reader of its base
//! rows that skips the rows its deltas change at the snapshot, plus those rows' images.
//!
//! A scan whose predicates pin every key column to a few values is a lookup instead: each key
//! is found through the MemRowSet index and the rowsets' key indexes, and only its row is read.
//! A join filter listing few keys of the first key column is looked up the same way, in the
//! MemRowSet's index and each rowset's key index, and the rowsets read only the rows found.
//! Either way the sources are put together under the read lock and read without it.
//!
//! A scan captures what it needs when it starts — the MemRowSet rows and delta images visible
//! at its snapshot, gathered into batches, and a reader per DiskRowSet opened on its file — so
//! it holds no lock while it runs and is unaffected by later writes, flushes or compactions.
//! Each batch is read with the projected and predicate columns only, filtered with Arrow
//! kernels, then cut down to the projection.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::filter_record_batch;
use arrow::datatypes::DataType;

use super::{State, Tablet};
use crate::delta::Image;
use crate::diskrowset::{RowsRead, RowsetReader};
use crate::memrowset::{visible, MemRowSet, RowRef, Version};
use crate::scan::{self, predicate_mask, ColumnPredicate, KeyRange, ScanIterator, ScanSpec};
use crate::{PageCache, Schema, StorageError, Timestamp};

/// The rowset index [`State::locate_at`] gives rows of the MemRowSet.
const IN_MEMROWSET: usize = usize::MAX;

impl Tablet {
    pub fn scan(&self, spec: &ScanSpec) -> Result<ScanIterator, StorageError> {
        self.check_history(spec.snapshot)?;
        if let Some(since) = spec.changes_since {
            self.check_history(since)?;
            return self.scan_changes(spec, since);
        }
        let state = self.state.read();
        let schema = &state.schema;
        let (read_columns, output_len) = read_columns(schema, spec)?;
        let table = schema.arrow_schema();
        if let Some(keys) = scan::point_keys(schema, &spec.predicates) {
            return self.lookup(&state, spec, keys, read_columns, output_len);
        }
        let batch_size = spec.batch_size.max(1);
        let cache = &self.options.page_cache;
        let listed = scan::listed_keys(schema, &spec.predicates);
        let mut sources = VecDeque::new();
        for (rowset, deltas) in state.rowsets.iter().zip(&state.deltas) {
            let (hidden, images) = deltas.view(
                rowset,
                spec.snapshot,
                &table,
                &read_columns,
                &state.arena,
                None,
            )?;
            let within = match &listed {
                Some(listed) => rowset.listed_rows(listed, cache)?,
                None => None,
            };
            let rows = RowsRead {
                hidden: &hidden,
                within: within.as_deref(),
            };
            sources.push_back(Source::Rowset(Box::new(rowset.reader(
                schema,
                &read_columns,
                rows,
                &spec.predicates,
                batch_size,
                spec.string_views,
            )?)));
            sources.extend(images.into_iter().map(Source::Batch));
        }
        let mem_keys = state.mrs.len() + state.frozen.as_ref().map_or(0, |f| f.len());
        let listed = listed.filter(|l| l.keys.len() * scan::ROWS_PER_LISTED_KEY <= mem_keys);
        let range = scan::key_range(schema, &spec.predicates);
        let whole = (listed.is_none()
            && state.frozen.is_none()
            && range.lower.is_empty()
            && range.upper.is_none())
        .then(|| state.mrs.whole_batches(spec.snapshot))
        .flatten();
        match whole {
            // Every row the MemRowSet holds is visible, each the only version of its key: its
            // batches are read as they are, without a look at each key.
            Some(batches) => {
                for &batch in batches {
                    let slices = state
                        .arena
                        .slices(&table, &read_columns, batch, batch_size)?;
                    sources.extend(slices.into_iter().map(Source::Batch));
                }
            }
            None => {
                // A join filter's few keys are looked up in the index instead.
                let mem_rows = match listed {
                    Some(listed) if listed.whole => (listed.keys.iter())
                        .filter_map(|key| state.visible_mem_version(key, spec.snapshot)?.row)
                        .collect(),
                    Some(listed) => (listed.prefix_ranges())
                        .flat_map(|r| state.visible_mem_rows(spec.snapshot, &r))
                        .collect(),
                    None => state.visible_mem_rows(spec.snapshot, &range),
                };
                for chunk in mem_rows.chunks(batch_size) {
                    sources.push_back(Source::Batch(state.arena.gather(
                        &table,
                        &read_columns,
                        chunk,
                    )?));
                }
            }
        }
        Ok(boxed_scan(&state, spec, read_columns, output_len, sources))
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
        let mut sources = VecDeque::new();
        let mut in_memory = Vec::new();
        for key in keys {
            let cache = &self.options.page_cache;
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
                // Images put together from per-column deltas; none if the changes leave the
                // columns read as the base data has them.
                Image::Undo | Image::Mem(_) => {
                    let (hidden, images) = state.deltas[rs].view(
                        &state.rowsets[rs],
                        spec.snapshot,
                        &table,
                        &read_columns,
                        &state.arena,
                        Some(ordinal),
                    )?;
                    let projected = Arc::new(table.project(&read_columns)?);
                    let row = arrow::compute::concat_batches(&projected, &images)?;
                    match row.num_rows() == 0 && !hidden.contains(&ordinal) {
                        true => base_row(state, rs, ordinal, &table, &read_columns, cache)?,
                        false => row,
                    }
                }
                Image::Base | Image::Absent => {
                    base_row(state, rs, ordinal, &table, &read_columns, cache)?
                }
            };
            sources.push_back(Source::Batch(row));
        }
        match in_memory[..] {
            [] => {}
            [row] => sources.push_back(Source::Batch(state.arena.row(
                &table,
                &read_columns,
                row,
            )?)),
            _ => sources.push_back(Source::Batch(state.arena.gather(
                &table,
                &read_columns,
                &in_memory,
            )?)),
        }
        Ok(boxed_scan(state, spec, read_columns, output_len, sources))
    }
}

/// Row `ordinal` of rowset `rs` as its base data has it (the columns `read_columns`).
fn base_row(
    state: &State,
    rs: usize,
    ordinal: u32,
    table: &arrow::datatypes::SchemaRef,
    read_columns: &[usize],
    cache: &PageCache,
) -> Result<RecordBatch, StorageError> {
    let row = state.rowsets[rs].read_row(read_columns, ordinal, cache)?;
    Ok(RecordBatch::try_new_with_options(
        Arc::new(table.project(read_columns)?),
        row.columns().to_vec(),
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
    )?)
}

/// The scan `spec` asks for, of `sources` (rows of the table columns `read_columns`).
fn boxed_scan(
    state: &State,
    spec: &ScanSpec,
    read_columns: Vec<usize>,
    output_len: usize,
    sources: VecDeque<Source>,
) -> ScanIterator {
    Box::new(Scan {
        schema: (*state.schema).clone(),
        read_columns,
        output_len,
        predicates: spec.predicates.clone(),
        remaining: spec.limit,
        sources,
        string_views: spec.string_views,
    })
}

impl State {
    /// The MemRowSet rows in `range` visible at `snapshot` (of `mrs` and, for keys without a
    /// visible version there, of `frozen`).
    fn visible_mem_rows(&self, snapshot: Timestamp, range: &KeyRange) -> Vec<RowRef> {
        let mut rows = self.mrs.visible_rows(snapshot, range);
        if let Some(frozen) = &self.frozen {
            for (key, versions) in frozen.index.range(range) {
                let newer = self.mrs.index.get(key).and_then(|v| visible(v, snapshot));
                if newer.is_none() {
                    rows.extend(visible(versions, snapshot).and_then(|v| v.row));
                }
            }
        }
        rows
    }

    /// The version of `key` visible at `snapshot` in the MemRowSet (or, without one there, in
    /// the one being flushed), if any: its row, or None for a deletion.
    fn visible_mem_version(&self, key: &[u8], snapshot: Timestamp) -> Option<&Version> {
        fn in_memory<'a>(mrs: &'a MemRowSet, key: &[u8], at: Timestamp) -> Option<&'a Version> {
            mrs.index.get(key).and_then(|v| visible(v, at))
        }
        in_memory(&self.mrs, key, snapshot)
            .or_else(|| in_memory(self.frozen.as_deref()?, key, snapshot))
    }

    /// The row with `key` visible at `snapshot`, if any (as a scan at `snapshot` sees it):
    /// in the MemRowSet (`rs` is [`IN_MEMROWSET`]), or in rowset `rs` at `ordinal`.
    fn locate_at(
        &self,
        key: &[u8],
        snapshot: Timestamp,
        cache: &PageCache,
    ) -> Result<Option<(usize, u32, Image)>, StorageError> {
        if let Some(v) = self.visible_mem_version(key, snapshot) {
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
}

/// One source of rows for a scan.
pub(crate) enum Source {
    /// Rows already gathered (MemRowSet rows, delta images); predicates still to apply.
    Batch(RecordBatch),
    /// A DiskRowSet's base rows, with hidden rows skipped and predicates applied by the reader.
    Rowset(Box<RowsetReader>),
}

pub(crate) struct Scan {
    pub schema: Schema,
    /// Table columns read: the projection, then predicate columns not in it.
    pub read_columns: Vec<usize>,
    /// How many of `read_columns` are returned.
    pub output_len: usize,
    pub predicates: Vec<ColumnPredicate>,
    pub remaining: Option<usize>,
    pub sources: VecDeque<Source>,
    /// [`ScanSpec::string_views`].
    pub string_views: bool,
}

impl Scan {
    /// The next batch, and whether the scan's predicates were already applied to it.
    fn next_raw(&mut self) -> Option<Result<(RecordBatch, bool), StorageError>> {
        loop {
            match self.sources.front_mut()? {
                Source::Batch(_) => {
                    let Some(Source::Batch(b)) = self.sources.pop_front() else {
                        unreachable!()
                    };
                    return Some(Ok((b, false)));
                }
                Source::Rowset(reader) => match reader.next() {
                    None => {
                        self.sources.pop_front();
                    }
                    Some(Err(e)) => return Some(Err(e)),
                    // Parquet returns columns in file order; scans want `read_columns` order.
                    Some(Ok(batch)) => {
                        return Some(
                            reorder(&self.schema, &self.read_columns, &batch).map(|b| (b, true)),
                        )
                    }
                },
            }
        }
    }

    fn finish(&self, batch: RecordBatch, filtered: bool) -> Result<RecordBatch, StorageError> {
        let batch = if filtered || self.predicates.is_empty() {
            batch
        } else {
            let mask = predicate_mask(&self.schema, &self.predicates, &batch)?;
            filter_record_batch(&batch, &mask)?
        };
        let keep: Vec<usize> = (0..self.output_len).collect();
        let batch = batch.project(&keep)?;
        match self.string_views {
            true => string_views(batch),
            false => Ok(batch),
        }
    }
}

/// `batch` with its `Utf8` columns as `Utf8View` (rows decoded from rowsets already are).
pub(super) fn string_views(batch: RecordBatch) -> Result<RecordBatch, StorageError> {
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| f.data_type() == &DataType::Utf8)
    {
        return Ok(batch);
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(fields.capacity());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        match field.data_type() {
            DataType::Utf8 => {
                fields.push(field.as_ref().clone().with_data_type(DataType::Utf8View));
                columns.push(arrow::compute::cast(column, &DataType::Utf8View)?);
            }
            _ => {
                fields.push(field.as_ref().clone());
                columns.push(column.clone());
            }
        }
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::new(arrow::datatypes::Schema::new(fields)),
        columns,
        &options,
    )?)
}

fn reorder(
    schema: &Schema,
    columns: &[usize],
    batch: &RecordBatch,
) -> Result<RecordBatch, StorageError> {
    let indexes = columns
        .iter()
        .map(|&c| {
            let name = &schema.columns()[c].name;
            batch
                .schema()
                .index_of(name)
                .map_err(|_| StorageError::Corruption(format!("rowset lacks column '{name}'")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(batch.project(&indexes)?)
}

impl Iterator for Scan {
    type Item = Result<RecordBatch, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.remaining == Some(0) {
                return None;
            }
            let batch = match self.next_raw()? {
                Ok((batch, filtered)) => self.finish(batch, filtered),
                Err(e) => Err(e),
            };
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    self.sources.clear();
                    return Some(Err(e));
                }
            };
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = match &mut self.remaining {
                Some(left) => {
                    let n = batch.num_rows().min(*left);
                    *left -= n;
                    batch.slice(0, n)
                }
                None => batch,
            };
            return Some(Ok(batch));
        }
    }
}

/// Table columns a scan reads: the projection, then predicate columns not in it.
pub(crate) fn read_columns(
    schema: &Schema,
    spec: &ScanSpec,
) -> Result<(Vec<usize>, usize), StorageError> {
    let n = schema.columns().len();
    let mut columns: Vec<usize> = spec.projection.clone().unwrap_or_else(|| (0..n).collect());
    if let Some(bad) = columns.iter().find(|&&c| c >= n) {
        return Err(StorageError::InvalidPredicate(format!(
            "projection column #{bad} does not exist"
        )));
    }
    let output_len = columns.len();
    for p in &spec.predicates {
        if p.column >= n {
            return Err(StorageError::InvalidPredicate(format!(
                "predicate column #{} does not exist",
                p.column
            )));
        }
        if !columns.contains(&p.column) {
            columns.push(p.column);
        }
    }
    Ok((columns, output_len))
}
