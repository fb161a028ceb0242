//! The MemRowSet: the newest rows of a tablet, in memory.
//!
//! Row data lives in a [`RowArena`] of Arrow batches (each applied write appends one batch of
//! full rows); an ordered index maps each encoded primary key to its versions
//! `(timestamp, row or deletion)`, oldest first. An UPDATE appends a new full row version, so a
//! scan at snapshot S takes, per key, the newest version at or before S, and gathers those rows
//! from the arena with `interleave` — batches in, batches out, in key order.
//!
//! The arena also holds the new row images of updates to rows already flushed to DiskRowSets
//! (see `delta`), so one flush empties it.

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::interleave;
use arrow::datatypes::SchemaRef;

use smallvec::SmallVec;

use crate::scan::KeyRange;
use crate::{KeyBytes, StorageError, Timestamp};

mod index;
pub use index::KeyIndex;

/// A row in the arena: (batch, row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRef {
    pub batch: u32,
    pub row: u32,
}

/// One version of a row: its full image, or `None` for a deletion.
#[derive(Clone, Copy, Debug)]
pub struct Version {
    pub ts: Timestamp,
    pub row: Option<RowRef>,
}

/// The newest version visible at `snapshot`, if any.
pub fn visible(versions: &[Version], snapshot: Timestamp) -> Option<&Version> {
    versions.iter().rev().find(|v| v.ts <= snapshot)
}

/// Batches with the table's columns; append-only until a flush drops those it wrote. A batch holds full
/// row images, or partial ones: the new values of some columns of rows on disk (per-column
/// deltas, whose other columns are those of the version before), NULL in the other columns.
#[derive(Default, Clone)]
pub struct RowArena {
    /// The number of the first batch held ([`RowRef`]s name batches by number).
    first: u32,
    batches: Vec<RecordBatch>,
    /// For each batch of partial images, the columns it holds.
    partial: Vec<Option<Vec<usize>>>,
    bytes: usize,
}

impl RowArena {
    /// Appends full rows; returns the reference of each.
    pub fn append(&mut self, batch: RecordBatch) -> Vec<RowRef> {
        self.push(batch, None)
    }

    /// Appends partial images holding the columns `columns` (the others NULL); returns the
    /// reference of each.
    pub fn append_partial(&mut self, batch: RecordBatch, columns: Vec<usize>) -> Vec<RowRef> {
        self.push(batch, Some(columns))
    }

    fn push(&mut self, batch: RecordBatch, partial: Option<Vec<usize>>) -> Vec<RowRef> {
        let b = self.end();
        let refs = (0..batch.num_rows() as u32)
            .map(|row| RowRef { batch: b, row })
            .collect();
        self.bytes += crate::write::rows_bytes(&batch);
        self.batches.push(batch);
        self.partial.push(partial);
        refs
    }

    /// Whether the image at `row` holds column `c`.
    pub fn holds(&self, row: RowRef, c: usize) -> bool {
        self.partial[(row.batch - self.first) as usize]
            .as_ref()
            .is_none_or(|columns| columns.contains(&c))
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The batches held, in order: `index` gives a row's place among them.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// The positions of the batches `rows` are in, ascending and without repeats. `interleave`
    /// inspects every source array it is given, so a read of a few rows takes its sources from
    /// these batches only ([`RowArena::column_sources`], [`RowArena::source_index`]), not from
    /// every batch of the arena.
    pub fn batches_holding(&self, rows: impl IntoIterator<Item = RowRef>) -> Vec<usize> {
        let mut batches: Vec<usize> = rows.into_iter().map(|r| self.index(r).0).collect();
        batches.sort_unstable();
        batches.dedup();
        batches
    }

    /// Column `c` of the batches at `batches` (from [`RowArena::batches_holding`]).
    pub fn column_sources(&self, batches: &[usize], c: usize) -> Vec<&dyn arrow::array::Array> {
        batches
            .iter()
            .map(|&b| self.batches[b].column(c).as_ref())
            .collect()
    }

    /// Where `row` is among the sources of [`RowArena::column_sources`]`(batches, _)`.
    pub fn source_index(&self, batches: &[usize], row: RowRef) -> (usize, usize) {
        let (batch, row) = self.index(row);
        (batches.partition_point(|&b| b < batch), row)
    }

    /// Where `row` is in [`RowArena::batches`]: (batch, row).
    pub fn index(&self, row: RowRef) -> (usize, usize) {
        ((row.batch - self.first) as usize, row.row as usize)
    }

    /// The number the next batch appended gets.
    pub fn end(&self) -> u32 {
        self.first + self.batches.len() as u32
    }

    /// Gathers rows into one batch with the columns `columns` (indexes into the table schema).
    pub fn gather(
        &self,
        schema: &SchemaRef,
        columns: &[usize],
        rows: &[RowRef],
    ) -> Result<RecordBatch, StorageError> {
        let projected = std::sync::Arc::new(schema.project(columns)?);
        if rows.is_empty() {
            return Ok(RecordBatch::new_empty(projected));
        }
        let batches = self.batches_holding(rows.iter().copied());
        let indices: Vec<(usize, usize)> = rows
            .iter()
            .map(|&r| self.source_index(&batches, r))
            .collect();
        let arrays = columns
            .iter()
            .map(|&c| interleave(&self.column_sources(&batches, c), &indices))
            .collect::<Result<Vec<ArrayRef>, _>>()?;
        Ok(RecordBatch::try_new_with_options(
            projected,
            arrays,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows.len())),
        )?)
    }

    /// One row with the columns `columns`, as a slice of the batch that holds it: no copy, for
    /// a key lookup's answer (which lives as long as the statement; a copy is made where an
    /// image is kept, by [`RowArena::gather`]).
    pub fn row(
        &self,
        schema: &SchemaRef,
        columns: &[usize],
        row: RowRef,
    ) -> Result<RecordBatch, StorageError> {
        let (batch, row) = self.index(row);
        let projected = std::sync::Arc::new(schema.project(columns)?);
        let source = &self.batches[batch];
        let arrays = columns
            .iter()
            .map(|&c| source.column(c).slice(row, 1))
            .collect();
        Ok(RecordBatch::try_new_with_options(
            projected,
            arrays,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
        )?)
    }

    /// Batch number `batch` with the columns `columns`, in slices of at most `rows` rows, no
    /// copy ([`RowArena::row`]'s, for a batch all of whose rows a scan reads).
    pub fn slices(
        &self,
        schema: &SchemaRef,
        columns: &[usize],
        batch: u32,
        rows: usize,
    ) -> Result<Vec<RecordBatch>, StorageError> {
        let (batch, _) = self.index(RowRef { batch, row: 0 });
        let projected = std::sync::Arc::new(schema.project(columns)?);
        let source = &self.batches[batch];
        let len = source.num_rows();
        (0..len)
            .step_by(rows.max(1))
            .map(|offset| {
                let n = rows.max(1).min(len - offset);
                let arrays = columns
                    .iter()
                    .map(|&c| source.column(c).slice(offset, n))
                    .collect();
                let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(n));
                Ok(RecordBatch::try_new_with_options(
                    projected.clone(),
                    arrays,
                    &options,
                )?)
            })
            .collect()
    }

    /// Drops the batches numbered below `end`.
    pub fn drop_before(&mut self, end: u32) {
        let n = (end.saturating_sub(self.first) as usize).min(self.batches.len());
        for batch in self.batches.drain(..n) {
            self.bytes -= crate::write::rows_bytes(&batch);
        }
        self.partial.drain(..n);
        self.first += n as u32;
    }
}

/// A key's versions in a MemRowSet, oldest first. Most keys have one (a row inserted and not
/// changed since), held inline: no allocation per inserted row beyond its key.
pub type Versions = SmallVec<[Version; 1]>;

/// New keys a MemRowSet of a table that is no queue counts before it settles on its index: a
/// `BTreeMap`, or [`KeyIndex::into_runs`] if at least [`IN_ORDER_PERCENT`] of them came after
/// every key before them (a sorted load, a time series, ids that count up).
const SETTLE_AFTER_KEYS: usize = 4096;
const IN_ORDER_PERCENT: usize = 90;

/// Ordered index from encoded primary key to the versions of rows not yet flushed.
#[derive(Clone)]
pub struct MemRowSet {
    pub index: KeyIndex<Versions>,
    /// A queue table's: its scans read rows in key order, never as whole batches.
    queue: bool,
    /// While the index is not settled (see [`SETTLE_AFTER_KEYS`]): the new keys pushed, and
    /// those of them that came after every key before them.
    new_keys: usize,
    in_order: usize,
    key_bytes: usize,
    /// The newest timestamp of a version pushed (a diff scan of a window after it has nothing
    /// to look for here).
    newest: Timestamp,
    /// While every key holds one version, a row of an arena batch all of whose rows were
    /// inserted here ([`MemRowSet::inserted_whole`]), the numbers of those batches, in order: a
    /// scan that sees every version reads them as they are, without walking the index
    /// ([`MemRowSet::whole_batches`]). None once a key has more versions, a deletion, or a row
    /// of another batch.
    whole: Option<Vec<u32>>,
}

impl MemRowSet {
    /// An empty MemRowSet, for a queue table's rows (`queue`: their keys come in runs, see
    /// [`KeyIndex`]) or any other.
    pub fn new(queue: bool) -> Self {
        MemRowSet {
            index: KeyIndex::new(queue),
            queue,
            new_keys: 0,
            in_order: 0,
            key_bytes: 0,
            newest: Timestamp(0),
            whole: Some(Vec::new()),
        }
    }

    /// Takes the rows, leaving an empty MemRowSet for the same table.
    pub fn take(&mut self) -> Self {
        std::mem::replace(self, MemRowSet::new(self.queue))
    }

    pub fn latest(&self, key: &[u8]) -> Option<&Version> {
        self.index.get(key).and_then(|v| v.last())
    }

    /// Adds a version of `key`. (Unless the caller then says the whole batch of its row was
    /// inserted here, [`MemRowSet::inserted_whole`], scans walk the index from now on.)
    pub fn push(&mut self, key: KeyBytes, version: Version) {
        let len = key.len();
        let settling = !self.queue && self.new_keys < SETTLE_AFTER_KEYS;
        let in_order = settling && self.index.after_last(&key);
        let versions = self.index.get_or_default(key);
        let new = versions.is_empty();
        if new {
            self.key_bytes += len + 48;
        } else {
            self.whole = None;
        }
        if version.row.is_none() {
            self.whole = None;
        }
        versions.push(version);
        self.key_bytes += std::mem::size_of::<Version>();
        self.newest = self.newest.max(version.ts);
        if settling && new {
            self.settle(in_order);
        }
    }

    /// Counts a new key, in order or not; the last of [`SETTLE_AFTER_KEYS`] settles the index.
    fn settle(&mut self, in_order: bool) {
        self.new_keys += 1;
        self.in_order += usize::from(in_order);
        if self.new_keys == SETTLE_AFTER_KEYS
            && self.in_order * 100 >= self.new_keys * IN_ORDER_PERCENT
        {
            let index = std::mem::replace(&mut self.index, KeyIndex::new(false));
            self.index = index.into_runs();
        }
    }

    /// Every row of arena batch `batch` was just pushed, each the first version of its key.
    pub fn inserted_whole(&mut self, batch: u32) {
        if let Some(whole) = &mut self.whole {
            whole.push(batch);
        }
    }

    /// Rows were pushed that are not all of an arena batch ([`MemRowSet::inserted_whole`]):
    /// scans walk the index.
    pub fn inserted_part(&mut self) {
        self.whole = None;
    }

    /// The arena batches that hold exactly the rows visible at `snapshot`, if there are such:
    /// every key has one version, a row of these batches, and `snapshot` sees them all. (Not
    /// in key order; a queue table's scans read its rows in order and never take them.)
    pub fn whole_batches(&self, snapshot: Timestamp) -> Option<&[u32]> {
        (!self.queue && snapshot >= self.newest)
            .then_some(self.whole.as_deref())
            .flatten()
    }

    /// The newest timestamp of a version it holds or held (an upper bound).
    pub fn newest(&self) -> Timestamp {
        self.newest
    }

    /// Rows in `range` visible at `snapshot`, in key order.
    pub fn visible_rows(&self, snapshot: Timestamp, range: &KeyRange) -> Vec<RowRef> {
        self.index
            .range(range)
            .filter_map(|(_, v)| visible(v, snapshot).and_then(|v| v.row))
            .collect()
    }

    pub fn bytes(&self) -> usize {
        self.key_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Keys held, deleted ones included: an upper bound of the visible rows.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Removes `key`; returns its versions.
    pub fn remove(&mut self, key: &[u8]) -> Versions {
        self.whole = None;
        let versions = self.index.remove(key).unwrap_or_default();
        if !versions.is_empty() {
            self.key_bytes -= key.len() + 48 + versions.len() * std::mem::size_of::<Version>();
        }
        versions
    }

    /// Adds `newer`'s versions after this one's.
    pub fn append(&mut self, newer: MemRowSet) {
        let whole = newer.whole.clone();
        for (key, versions) in newer.index.into_entries() {
            for version in versions {
                self.push(key.clone(), version);
            }
        }
        match (&mut self.whole, whole) {
            (Some(mine), Some(theirs)) => mine.extend(theirs),
            (mine, _) => *mine = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys that come in order settle a MemRowSet's index as runs, keys in another order as a
    /// tree; either way it finds every key and lists them in order, and a table that is no
    /// queue still has its batches read whole.
    #[test]
    fn the_index_settles_by_how_keys_come() {
        let n = 2 * SETTLE_AFTER_KEYS as u64;
        for in_order in [true, false] {
            let mut mrs = MemRowSet::new(false);
            // (7919 is prime to n: a permutation of 0..n.)
            let keys: Vec<u64> = (0..n)
                .map(|i| if in_order { i } else { i * 7919 % n })
                .collect();
            for (i, k) in keys.iter().enumerate() {
                let version = Version {
                    ts: Timestamp(i as u64 + 1),
                    row: Some(RowRef {
                        batch: 0,
                        row: i as u32,
                    }),
                };
                mrs.push(KeyBytes::from_slice(&k.to_be_bytes()), version);
            }
            assert_eq!(matches!(mrs.index, KeyIndex::Runs(_)), in_order);
            for (i, k) in keys.iter().enumerate() {
                let found = mrs.latest(&k.to_be_bytes()).map(|v| v.ts);
                assert_eq!(found, Some(Timestamp(i as u64 + 1)), "key {k}");
            }
            let listed: Vec<u64> = (mrs.index.iter())
                .map(|(k, _)| u64::from_be_bytes(k[..].try_into().unwrap()))
                .collect();
            assert_eq!(listed, (0..n).collect::<Vec<_>>());
            assert!(mrs.whole_batches(Timestamp(u64::MAX)).is_some());
            // The next MemRowSet settles anew.
            mrs.take();
            assert!(matches!(mrs.index, KeyIndex::Tree(_)));
        }
        let queue = MemRowSet::new(true);
        assert!(matches!(queue.index, KeyIndex::Runs(_)));
        assert!(queue.whole_batches(Timestamp(u64::MAX)).is_none());
    }
}
