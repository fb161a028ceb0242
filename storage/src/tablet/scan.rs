//! Scans of a tablet: the MemRowSet's visible rows and, per DiskRowSet, a reader of its base
//! rows that skips the rows its deltas change at the snapshot, plus those rows' images.
//!
//! A scan whose predicates pin every key column to a few values is a lookup instead: each key
//! is found through the MemRowSet index and the rowsets' key indexes, and only its row is read.
//! Either way the sources are put together under the read lock and read without it.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::RecordBatch;

use super::{State, Tablet};
use crate::delta::Image;
use crate::memrowset::{visible, MemRowSet, RowRef, Version};
use crate::scan::{self, KeyRange, ScanIterator, ScanSpec, Source};
use crate::{PageCache, StorageError, Timestamp};

/// The rowset index [`State::locate_at`] gives rows of the MemRowSet.
const IN_MEMROWSET: usize = usize::MAX;

impl Tablet {
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
            sources.push_back(Source::Rowset(Box::new(rowset.reader(
                schema,
                &read_columns,
                &hidden,
                &spec.predicates,
                batch_size,
                spec.string_views,
            )?)));
            sources.extend(images.into_iter().map(Source::Batch));
        }
        let range = scan::key_range(schema, &spec.predicates);
        let mem_rows = state.visible_mem_rows(spec.snapshot, &range);
        for chunk in mem_rows.chunks(batch_size) {
            sources.push_back(Source::Batch(state.arena.gather(
                &table,
                &read_columns,
                chunk,
            )?));
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
    scan::boxed(scan::Scan {
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

    /// The row with `key` visible at `snapshot`, if any (as a scan at `snapshot` sees it):
    /// in the MemRowSet (`rs` is [`IN_MEMROWSET`]), or in rowset `rs` at `ordinal`.
    fn locate_at(
        &self,
        key: &[u8],
        snapshot: Timestamp,
        cache: &PageCache,
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
}
