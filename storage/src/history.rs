//! Row histories as version chains, and rowsets written from them.
//!
//! A flush, a compaction and a schema change all do the same thing: take the full version
//! chain of every row they move (from the MemRowSet, or rebuilt from a rowset's UNDO records,
//! base image and REDO records), and write new rowsets in which each row's newest live image
//! is the base data, the versions before it become UNDO records and a final deletion becomes a
//! REDO record. History that no allowed snapshot can see (at or before the ancient history
//! mark) is dropped on the way, as are rows deleted before it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use arrow::array::{new_null_array, Array, RecordBatch};
use arrow::compute::interleave;

use crate::delta::{DeltaFile, Layout, Record, RowsetDeltas};
use crate::diskrowset::{ColumnFile, DiskRowSet};
use crate::{Schema, StorageError, Timestamp};

/// A row image: (source batch, row) in the sources of a rewrite.
pub type ImageRef = (usize, usize);

/// The versions of one key, oldest first; `None` is a deletion. A version with timestamp 0
/// started before the ancient history mark (its real start was forgotten).
pub struct Chain {
    pub key: Vec<u8>,
    pub versions: Vec<(Timestamp, Option<ImageRef>)>,
}

/// A rowset to add to the tablet: its base data and history files.
pub struct NewRowset {
    pub rowset: Arc<DiskRowSet>,
    pub deltas: RowsetDeltas,
}

/// Files written by one operation, removed again if it fails before its metadata is written.
pub struct NewFiles<'a> {
    pub dir: &'a std::path::Path,
    pub next_id: u64,
    pub paths: Vec<std::path::PathBuf>,
    /// Called after each file is written (crash tests).
    pub fail: &'a dyn Fn(&str) -> Result<(), StorageError>,
    /// Takes the key pages of new rowsets, so lookups find them warm.
    pub page_cache: &'a crate::PageCache,
}

impl NewFiles<'_> {
    pub fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    pub fn delta(
        &mut self,
        schema: &Schema,
        layout: Layout,
        sources: &[&RecordBatch],
        records: &[Record],
    ) -> Result<Arc<DeltaFile>, StorageError> {
        let id = self.take_id();
        self.paths.push(self.dir.join(DeltaFile::file_name(id)));
        let file = DeltaFile::write(self.dir, id, schema, layout, sources, records)?;
        (self.fail)("delta_written")?;
        Ok(Arc::new(file))
    }

    /// New base data of the table columns `columns` of `rowset` (see
    /// [`DiskRowSet::write_columns`]).
    pub fn columns(
        &mut self,
        rowset: &DiskRowSet,
        schema: &Schema,
        columns: &[u32],
        batches: &[RecordBatch],
    ) -> Result<ColumnFile, StorageError> {
        let id = self.take_id();
        self.paths.push(self.dir.join(ColumnFile::file_name(id)));
        let file = rowset.write_columns(self.dir, id, schema, columns, batches)?;
        (self.fail)("columns_written")?;
        Ok(file)
    }

    pub fn remove_all(&self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes `chains` (in key order) as rowsets of at most `rows_per_rowset` rows.
pub fn write_chains(
    files: &mut NewFiles,
    schema: &Schema,
    sources: &[&RecordBatch],
    chains: impl IntoIterator<Item = Chain>,
    ancient: Timestamp,
    rows_per_rowset: usize,
) -> Result<Vec<NewRowset>, StorageError> {
    let mut out = Vec::new();
    // Each rowset's vectors take their size at once (a flush's are hundreds of thousands of
    // rows long: grown by doubling, they were copied and faulted in again and again).
    let chains = chains.into_iter();
    let mut left = chains.size_hint().0;
    let mut pending = Pending::for_rows(left.min(rows_per_rowset));
    for chain in chains {
        left = left.saturating_sub(1);
        let versions = &chain.versions;
        // The newest live image becomes the base; a row never live, or deleted for good before
        // the ancient history mark, is gone.
        let Some(b) = versions.iter().rposition(|v| v.1.is_some()) else {
            continue;
        };
        if let Some((ts, None)) = versions.last() {
            if *ts <= ancient {
                continue;
            }
        }
        let ordinal = pending.keys.len() as u32;
        for i in 0..=b {
            if versions[i].0 > ancient {
                if pending.undo.capacity() == 0 {
                    // Rows with history: likely all of them (a flush's recent rows).
                    pending.undo.reserve(pending.keys.capacity());
                }
                pending.undo.push(Record {
                    ordinal,
                    ts: versions[i].0,
                    image: i.checked_sub(1).and_then(|p| versions[p].1),
                });
            }
        }
        for &(ts, image) in &versions[b + 1..] {
            pending.redo.push(Record { ordinal, ts, image });
        }
        pending.base.push(versions[b].1.expect("live version"));
        pending.keys.push(chain.key);
        if pending.keys.len() >= rows_per_rowset {
            let next = Pending::for_rows(left.min(rows_per_rowset));
            out.push(std::mem::replace(&mut pending, next).write(files, schema, sources)?);
        }
    }
    if !pending.keys.is_empty() {
        out.push(pending.write(files, schema, sources)?);
    }
    Ok(out)
}

struct Pending {
    keys: Vec<Vec<u8>>,
    base: Vec<ImageRef>,
    undo: Vec<Record>,
    redo: Vec<Record>,
}

impl Pending {
    /// Room for `rows` rows' keys and base images.
    fn for_rows(rows: usize) -> Self {
        Pending {
            keys: Vec::with_capacity(rows),
            base: Vec::with_capacity(rows),
            undo: Vec::new(),
            redo: Vec::new(),
        }
    }

    fn write(
        self,
        files: &mut NewFiles,
        schema: &Schema,
        sources: &[&RecordBatch],
    ) -> Result<NewRowset, StorageError> {
        let batches = base_batches(&schema.arrow_schema(), sources, &self.base)?;
        let id = files.take_id();
        files.paths.push(files.dir.join(DiskRowSet::file_name(id)));
        let rowset =
            DiskRowSet::write(files.dir, id, schema, &batches, self.keys, files.page_cache)?;
        (files.fail)("rowset_written")?;
        let undo = match self.undo.is_empty() {
            true => vec![],
            false => vec![files.delta(schema, Layout::default(), sources, &self.undo)?],
        };
        // Versions after the base image can only be a final deletion.
        let deletions = Layout {
            columns: None,
            changed: Some(vec![]),
        };
        let redo = match self.redo.is_empty() {
            true => vec![],
            false => vec![files.delta(schema, deletions, sources, &self.redo)?],
        };
        Ok(NewRowset {
            rowset: Arc::new(rowset),
            deltas: RowsetDeltas::new(undo, redo)?,
        })
    }
}

/// Base images that run on in one source for this many rows on average are taken as slices
/// of it, not copied.
const SLICED_RUN_ROWS: usize = 1024;

/// The images `base` refers to, as batches of schema `table`: slices of the sources if the
/// images run on in them (a flush of rows written in key order in large batches, as a bulk
/// load's, or a queue's whose writes each hold many), else gathered.
fn base_batches(
    table: &arrow::datatypes::SchemaRef,
    sources: &[&RecordBatch],
    base: &[ImageRef],
) -> Result<Vec<RecordBatch>, StorageError> {
    let continues = |w: &[ImageRef]| w[1] == (w[0].0, w[0].1 + 1);
    let runs = 1 + base.windows(2).filter(|w| !continues(w)).count();
    let mut batches = Vec::new();
    if base.len() >= runs * SLICED_RUN_ROWS {
        let mut start = 0;
        for end in 1..=base.len() {
            if end == base.len() || !continues(&base[end - 1..=end]) {
                let (source, row) = base[start];
                let slice = sources[source].slice(row, end - start);
                batches.push(RecordBatch::try_new(
                    table.clone(),
                    slice.columns().to_vec(),
                )?);
                start = end;
            }
        }
        return Ok(batches);
    }
    for part in base.chunks(64 * 1024) {
        let columns = (0..table.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> =
                    sources.iter().map(|b| b.column(c).as_ref()).collect();
                interleave(&arrays, part)
            })
            .collect::<Result<Vec<_>, _>>()?;
        batches.push(RecordBatch::try_new(table.clone(), columns)?);
    }
    Ok(batches)
}

/// The chains of every row of a rowset whose DeltaMemStore is empty, rebuilt from its files.
/// Their images are added to `sources`.
pub fn rowset_chains(
    rowset: &DiskRowSet,
    deltas: &RowsetDeltas,
    width: usize,
    sources: &mut Vec<RecordBatch>,
) -> Result<Vec<Chain>, StorageError> {
    debug_assert!(deltas.dms.is_empty());
    let n = rowset.num_rows();
    let all: Vec<usize> = (0..width).collect();
    let base = sources.len();
    sources.push(rowset.read_rows(&all, &(0..n as u32).collect::<Vec<_>>())?);
    // Per UNDO file: its records, the source index of its images (NULL in the columns the
    // file does not hold), the columns it holds, and the next record not yet taken.
    let mut undo = Vec::new();
    let table = sources[base].schema();
    for file in &deltas.undo {
        let records = file.read(&all)?;
        let held: Vec<usize> = all.iter().copied().filter(|&c| file.has(c)).collect();
        let n = records.ordinals.len();
        let columns = (0..width)
            .map(|c| match held.iter().position(|&h| h == c) {
                Some(i) => records.images.column(i).clone(),
                None => new_null_array(table.field(c).data_type(), n),
            })
            .collect();
        sources.push(RecordBatch::try_new_with_options(
            nullable(&table),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        )?);
        undo.push((records, sources.len() - 1, held, 0usize));
    }
    let mut redo = Vec::new();
    for file in &deltas.redo {
        let records = file.read(&all)?;
        sources.push(records.images.clone());
        redo.push((sources.len() - 1, records));
    }
    let mut redo_pos = vec![0; redo.len()];
    let keys = rowset.read_keys()?;
    // Images put together from per-column UNDO records: the source of each column.
    let mut composed: Vec<Vec<ImageRef>> = Vec::new();
    let composed_source = sources.len();
    let mut chains = Vec::with_capacity(n);
    // (Reused from row to row: most rows have one UNDO record, their insertion.)
    let mut records: Vec<(Timestamp, Option<Vec<ImageRef>>)> = Vec::new();
    let mut row_records = Vec::new();
    for ordinal in 0..n as u32 {
        // This row's UNDO records, oldest first (each file's records are older than the next
        // file's): (ts, image before ts as the source of each column, or None).
        records.clear();
        row_records.clear();
        for (f, (file, _, _, pos)) in undo.iter_mut().enumerate() {
            while *pos < file.ordinals.len() && file.ordinals[*pos] == ordinal {
                let absent = file.deleted.value(*pos);
                row_records.push((file.ts[*pos], f, *pos, absent));
                *pos += 1;
            }
        }
        // Newest first: the image before a record is the image after it with the record's
        // columns replaced (the base image, until a record replaces some).
        let mut after: Option<Vec<ImageRef>> = None;
        for &(ts, f, row, absent) in row_records.iter().rev() {
            let before = match absent {
                true => None,
                false => {
                    let mut image =
                        (after.take()).unwrap_or_else(|| vec![(base, ordinal as usize); width]);
                    let (_, source, held, _) = &undo[f];
                    for &c in held {
                        image[c] = (*source, row);
                    }
                    Some(image)
                }
            };
            records.push((Timestamp(ts), before.clone()));
            if before.is_some() {
                after = before;
            }
        }
        records.reverse();
        let mut image_ref = |image: Option<Vec<ImageRef>>| -> Option<ImageRef> {
            let image = image?;
            // An image taken whole from one row needs no new row.
            let first = image[0];
            if image.iter().all(|&i| i == first) {
                return Some(first);
            }
            composed.push(image);
            Some((composed_source, composed.len() - 1))
        };
        // The version starting at each record's ts is the image before the next record, or
        // the base image after the last; before the first record, its image.
        let mut versions = Vec::new();
        match records.first() {
            None => versions.push((Timestamp(0), Some((base, ordinal as usize)))),
            Some((_, first)) => {
                if let Some(image) = image_ref(first.clone()) {
                    versions.push((Timestamp(0), Some(image)));
                }
                for (k, (ts, _)) in records.iter().enumerate() {
                    let image = match records.get(k + 1) {
                        Some((_, next)) => image_ref(next.clone()),
                        None => Some((base, ordinal as usize)),
                    };
                    versions.push((*ts, image));
                }
            }
        }
        for ((source, records), pos) in redo.iter().zip(&mut redo_pos) {
            while *pos < records.ordinals.len() && records.ordinals[*pos] == ordinal {
                let image = (!records.deleted.value(*pos)).then_some((*source, *pos));
                versions.push((Timestamp(records.ts[*pos]), image));
                *pos += 1;
            }
        }
        chains.push(Chain {
            key: keys.value(ordinal as usize).to_vec(),
            versions,
        });
    }
    // The composed images, as one more source batch.
    let mut columns = Vec::with_capacity(width);
    for c in 0..width {
        let arrays: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
        let indices: Vec<ImageRef> = composed.iter().map(|image| image[c]).collect();
        columns.push(interleave(&arrays, &indices)?);
    }
    sources.push(RecordBatch::try_new_with_options(
        nullable(&table),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(composed.len())),
    )?);
    Ok(chains)
}

/// Major delta compaction of a rowset whose REDO records change only the table columns
/// `columns` (ascending) and whose DeltaMemStore is empty: writes the newest live values of
/// those columns as a column file of the rowset and the values they replace as per-column UNDO
/// records (history at or before `ancient` dropped). Rows keep their ordinals, so REDO
/// deletions stay.
pub fn apply_redo_to_columns(
    files: &mut NewFiles,
    schema: &Schema,
    rowset: &DiskRowSet,
    deltas: &RowsetDeltas,
    columns: &[u32],
    ancient: Timestamp,
) -> Result<NewRowset, StorageError> {
    debug_assert!(deltas.dms.is_empty());
    let wanted: Vec<usize> = columns.iter().map(|&c| c as usize).collect();
    let n = rowset.num_rows();
    // Sources: the base data of the columns, then each REDO file's images of them.
    let mut sources = vec![rowset.read_rows(&wanted, &(0..n as u32).collect::<Vec<_>>())?];
    let mut records = Vec::new();
    for file in &deltas.redo {
        let read = file.read(&wanted)?;
        for (row, (&ordinal, &ts)) in read.ordinals.iter().zip(&read.ts).enumerate() {
            let image = (!read.deleted.value(row)).then_some((sources.len(), row));
            records.push(Record {
                ordinal,
                ts: Timestamp(ts),
                image,
            });
        }
        sources.push(read.images);
    }
    // Files are in time order and each is sorted: a stable sort keeps each row's records in
    // time order.
    records.sort_by_key(|r| r.ordinal);
    let mut newest: Vec<ImageRef> = (0..n).map(|o| (0, o)).collect();
    let (mut undo, mut redo) = (Vec::new(), Vec::new());
    for record in records {
        let o = record.ordinal as usize;
        match record.image {
            None => redo.push(record),
            Some(image) => {
                if record.ts > ancient {
                    undo.push(Record {
                        image: Some(newest[o]),
                        ..record
                    });
                }
                newest[o] = image;
            }
        }
    }
    // The records join those of the newest UNDO file when it holds the same columns (repeated
    // updates of the same columns keep one such file).
    let mut undo_files = deltas.undo.clone();
    if let Some(last) = undo_files.pop_if(|f| f.meta.columns.as_deref() == Some(columns)) {
        let read = last.read(&wanted)?;
        let mut older: Vec<Record> = (read.ordinals.iter().zip(&read.ts).enumerate())
            .map(|(row, (&ordinal, &ts))| Record {
                ordinal,
                ts: Timestamp(ts),
                image: (!read.deleted.value(row)).then_some((sources.len(), row)),
            })
            .collect();
        sources.push(read.images);
        // Stable: each row's older records stay first.
        older.append(&mut undo);
        older.sort_by_key(|r| r.ordinal);
        undo = older;
    }
    let refs: Vec<&RecordBatch> = sources.iter().collect();
    let mut batches = Vec::new();
    for part in newest.chunks(64 * 1024) {
        let arrays = (0..wanted.len())
            .map(|c| {
                let arrays: Vec<&dyn Array> = refs.iter().map(|b| b.column(c).as_ref()).collect();
                interleave(&arrays, part)
            })
            .collect::<Result<Vec<_>, _>>()?;
        batches.push(RecordBatch::try_new(sources[0].schema(), arrays)?);
    }
    let column_file = files.columns(rowset, schema, columns, &batches)?;
    if !undo.is_empty() {
        let layout = Layout {
            columns: Some(columns.to_vec()),
            changed: None,
        };
        undo_files.push(files.delta(schema, layout, &refs, &undo)?);
    }
    let deletions = Layout {
        columns: None,
        changed: Some(vec![]),
    };
    let redo_files = match redo.is_empty() {
        true => vec![],
        false => vec![files.delta(schema, deletions, &[], &redo)?],
    };
    Ok(NewRowset {
        rowset: Arc::new(rowset.with_column_file(column_file)),
        deltas: RowsetDeltas::new(undo_files, redo_files)?,
    })
}

/// `schema` with every field nullable (for batches of row images that include deletions).
pub(crate) fn nullable(schema: &arrow::datatypes::SchemaRef) -> arrow::datatypes::SchemaRef {
    Arc::new(arrow::datatypes::Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ))
}

/// Merges the chains of several rowsets (each in key order) into one chain per key, in key
/// order, as the caller takes them: a k-way merge, so no copy of all chains is made or sorted.
/// Chains of a key deleted before the ancient history mark are dropped first: the others have
/// disjoint lifetimes, so their versions sort by timestamp. Lifetimes may touch: a transaction
/// that deletes a key and writes it again does both at its commit timestamp, the deletion
/// ending the older chain and the new image starting a chain in another rowset. So a key's
/// chains are put in the order they began (the rowsets' order says nothing: a rewritten rowset
/// comes after the newer ones), ties in the order of `parts`.
pub fn merge_chains(parts: Vec<Vec<Chain>>, ancient: Timestamp) -> impl Iterator<Item = Chain> {
    let mut merge = MergedChains {
        parts: parts.into_iter().map(Vec::into_iter).collect(),
        heads: BinaryHeap::new(),
        ancient,
    };
    for part in 0..merge.parts.len() {
        merge.advance(part);
    }
    merge
}

/// The state of [`merge_chains`]: each part's next live chain, smallest first.
struct MergedChains {
    parts: Vec<std::vec::IntoIter<Chain>>,
    heads: BinaryHeap<Reverse<Head>>,
    ancient: Timestamp,
}

/// A part's next chain, ordered by key, then by when it began, then by part.
struct Head {
    chain: Chain,
    part: usize,
}

impl Head {
    fn order(&self) -> (&[u8], Option<Timestamp>, usize) {
        let began = self.chain.versions.first().map(|v| v.0);
        (&self.chain.key, began, self.part)
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.order() == other.order()
    }
}

impl Eq for Head {}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order().cmp(&other.order())
    }
}

impl MergedChains {
    /// Puts the next chain of `part` not deleted before the ancient history mark among the
    /// heads.
    fn advance(&mut self, part: usize) {
        let ancient = self.ancient;
        let dead = |c: &Chain| matches!(c.versions.last(), Some((ts, None)) if *ts <= ancient);
        if let Some(chain) = self.parts[part].by_ref().find(|c| !dead(c)) {
            self.heads.push(Reverse(Head { chain, part }));
        }
    }
}

impl Iterator for MergedChains {
    type Item = Chain;

    fn next(&mut self) -> Option<Chain> {
        let Reverse(Head { mut chain, part }) = self.heads.pop()?;
        self.advance(part);
        while let Some(Reverse(next)) = self.heads.peek() {
            if next.chain.key != chain.key {
                break;
            }
            let Some(Reverse(Head { chain: same, part })) = self.heads.pop() else {
                break;
            };
            self.advance(part);
            chain.versions.extend(same.versions);
            chain.versions.sort_by_key(|v| v.0);
        }
        Some(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(key: &str, versions: &[(u64, Option<usize>)]) -> Chain {
        Chain {
            key: key.as_bytes().to_vec(),
            versions: (versions.iter())
                .map(|&(ts, image)| (Timestamp(ts), image.map(|row| (0, row))))
                .collect(),
        }
    }

    fn shown(chains: impl Iterator<Item = Chain>) -> Vec<(String, Vec<(u64, Option<usize>)>)> {
        chains
            .map(|c| {
                let versions = (c.versions.iter()).map(|(ts, i)| (ts.0, i.map(|i| i.1)));
                (String::from_utf8(c.key).unwrap(), versions.collect())
            })
            .collect()
    }

    #[test]
    fn base_images_that_run_on_in_a_source_are_sliced_and_read_as_gathered() {
        use arrow::array::{Int64Array, StringArray};
        use arrow::datatypes::{DataType, Field};
        let table = Arc::new(arrow::datatypes::Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        let source = |first: i64| {
            let keys = Int64Array::from_iter_values(first..first + 3000);
            let values = StringArray::from_iter((first..first + 3000).map(|k| Some(k.to_string())));
            RecordBatch::try_new(table.clone(), vec![Arc::new(keys), Arc::new(values)]).unwrap()
        };
        let (a, b) = (source(0), source(3000));
        let sources = [&a, &b];
        let gathered = |base: &[ImageRef]| {
            let batches = base_batches(&table, &sources, base).unwrap();
            arrow::compute::concat_batches(&table, &batches).unwrap()
        };
        // Two long runs (sliced), then every other row (gathered).
        let runs: Vec<ImageRef> = (100..2600)
            .map(|r| (1, r))
            .chain((0..2000).map(|r| (0, r)))
            .collect();
        let scattered: Vec<ImageRef> = (0..3000).step_by(2).map(|r| (r % 2, r)).collect();
        for base in [runs, scattered] {
            let expected: Vec<i64> = base
                .iter()
                .map(|&(s, r)| s as i64 * 3000 + r as i64)
                .collect();
            let got = gathered(&base);
            let keys = got.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            assert_eq!(keys.values().to_vec(), expected);
            let values = got
                .column(1)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            let values: Vec<i64> = values.iter().map(|v| v.unwrap().parse().unwrap()).collect();
            assert_eq!(values, expected);
        }
    }

    #[test]
    fn merged_chains_come_in_key_order_one_per_key_their_versions_in_time_order() {
        let parts = vec![
            // Began when the chain of "c" in the last part ended (a rewritten rowset comes
            // after newer ones): after it.
            vec![chain("a", &[(5, Some(1))]), chain("c", &[(12, Some(6))])],
            vec![
                chain("b", &[(3, Some(3))]),
                // Deleted before the ancient history mark (10): dropped.
                chain("c", &[(2, Some(4)), (4, None)]),
                chain("d", &[(6, Some(5))]),
            ],
            vec![
                chain("c", &[(9, Some(2)), (12, None)]),
                chain("e", &[(1, Some(7))]),
            ],
        ];
        let merged = shown(merge_chains(parts, Timestamp(10)));
        let expected = vec![
            ("a".to_string(), vec![(5, Some(1))]),
            ("b".to_string(), vec![(3, Some(3))]),
            (
                "c".to_string(),
                vec![(9, Some(2)), (12, None), (12, Some(6))],
            ),
            ("d".to_string(), vec![(6, Some(5))]),
            ("e".to_string(), vec![(1, Some(7))]),
        ];
        assert_eq!(merged, expected);
    }
}
