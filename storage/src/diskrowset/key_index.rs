//! The primary-key index of a rowset, and key lookups.
//!
//! Keys are not stored separately: they are encoded from the key columns of the rowset's file
//! when read. What stays in memory is the first key of each page and a bloom filter (Kudu's
//! sparse index and bloom filter), so that a lookup of a key the rowset does not hold usually
//! costs one cache line, and one that it may hold decodes a single page of keys (kept in the
//! shared [`PageCache`]).
//! Keys within a rowset are unique and ascending with the ordinal: checked when indexed.

use std::path::Path;

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use super::reader::gaps;
use super::{read_positions, DiskRowSet};
use crate::bloom::{hash_bytes, SplitBlockFilter};
use crate::cache::PageCache;
use crate::scan::{ListedKeys, ROWS_PER_LISTED_KEY};
use crate::StorageError;

/// A rowset's primary-key index (Kudu's sparse index and bloom filter): in memory, the first
/// key of each page of the (first) key column and the last key, packed into one buffer, and a
/// split-block bloom filter over all keys, so most lookups of a key the rowset does not hold
/// stop at one cache line. A lookup that passes the filter finds the one page that can hold
/// the key by binary search over the first keys, and searches that page, read from the file
/// (see [`DiskRowSet::find`]).
pub(super) struct KeyIndex {
    /// The first key of each page, then the last key, with the end offset of each.
    bytes: Vec<u8>,
    ends: Vec<u32>,
    /// The ordinal of each page's first row, then the number of rows.
    pub(super) starts: Vec<u32>,
    bloom: SplitBlockFilter,
    /// Names this index's pages in a [`PageCache`].
    pub(super) cache_id: u64,
}

impl KeyIndex {
    /// The index of `keys` (all of them, which must be ascending) in pages starting at
    /// `page_starts` (ascending, the first 0); `what` names the file in errors.
    pub(super) fn new<'a>(
        keys: impl ExactSizeIterator<Item = &'a [u8]>,
        page_starts: &[u32],
        what: &Path,
    ) -> Result<Self, StorageError> {
        let n = keys.len();
        let mut index = KeyIndex {
            bytes: Vec::new(),
            ends: Vec::new(),
            starts: Vec::new(),
            bloom: SplitBlockFilter::with_keys(n),
            cache_id: crate::cache::next_index_id(),
        };
        let mut starts = page_starts.iter().copied().peekable();
        let mut previous: Option<&[u8]> = None;
        for (i, key) in keys.enumerate() {
            if previous.is_some_and(|p| p >= key) {
                return Err(StorageError::Corruption(format!(
                    "{}: keys out of order",
                    what.display()
                )));
            }
            previous = Some(key);
            let page_start = i == 0 || starts.peek().is_some_and(|&s| s as usize <= i);
            while starts.next_if(|&s| s as usize <= i).is_some() {}
            if page_start {
                index.push(key)?;
                index.starts.push(i as u32);
            }
            index.bloom.insert(hash_bytes(key));
        }
        index.push(previous.unwrap_or_default())?;
        index.starts.push(n as u32);
        index.bytes.shrink_to_fit();
        Ok(index)
    }

    fn push(&mut self, key: &[u8]) -> Result<(), StorageError> {
        self.bytes.extend_from_slice(key);
        let end = u32::try_from(self.bytes.len())
            .map_err(|_| StorageError::Corruption("the keys of one rowset exceed 4 GiB".into()))?;
        self.ends.push(end);
        Ok(())
    }

    pub(super) fn len(&self) -> usize {
        self.starts.last().map_or(0, |&n| n as usize)
    }

    fn pages(&self) -> usize {
        self.starts.len() - 1
    }

    /// The first key of page `p`, or the last key for `p == pages()`.
    fn get(&self, p: usize) -> &[u8] {
        let start = match p {
            0 => 0,
            _ => self.ends[p - 1] as usize,
        };
        &self.bytes[start..self.ends[p] as usize]
    }

    /// The number of leading pages whose first key satisfies `before` (monotone).
    fn partition_point(&self, before: impl Fn(&[u8]) -> bool) -> usize {
        let (mut low, mut high) = (0, self.pages());
        while low < high {
            let mid = (low + high) / 2;
            if before(self.get(mid)) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// An ordinal at or before the first key for which `before` (monotone) fails.
    pub(super) fn lower_bound(&self, before: impl Fn(&[u8]) -> bool) -> usize {
        self.starts[self.partition_point(before).saturating_sub(1)] as usize
    }

    /// An ordinal at or after the last key for which `before` (monotone) holds, plus one.
    pub(super) fn upper_bound(&self, before: impl Fn(&[u8]) -> bool) -> usize {
        self.starts[self.partition_point(before)] as usize
    }

    /// The page that can hold `key` (whose [`hash_bytes`] is `hash`), if any can.
    fn page_of(&self, key: &[u8], hash: u64) -> Option<usize> {
        let pages = self.pages();
        if pages == 0 || key < self.get(0) || key > self.get(pages) || !self.bloom.check(hash) {
            return None;
        }
        Some(self.partition_point(|first| first <= key) - 1)
    }

    pub(super) fn memory_bytes(&self) -> usize {
        self.bytes.capacity()
            + (self.ends.capacity() + self.starts.capacity()) * 4
            + self.bloom.bytes()
    }
}

/// The ordinal of the first row of each page of the file's column `key_column` (the first key
/// column), from its offset index (or of each row group without one).
pub(super) fn key_page_starts(metadata: &ArrowReaderMetadata, key_column: usize) -> Vec<u32> {
    let file = metadata.metadata();
    let mut starts = Vec::new();
    let mut group_start = 0;
    for (g, group) in file.row_groups().iter().enumerate() {
        match file
            .offset_index()
            .and_then(|index| index.get(g)?.get(key_column))
        {
            Some(pages) => starts.extend(
                pages
                    .page_locations()
                    .iter()
                    .map(|page| (group_start + page.first_row_index) as u32),
            ),
            None => starts.push(group_start as u32),
        }
        group_start += group.num_rows();
    }
    starts
}

impl DiskRowSet {
    /// The smallest and the largest key (None for a rowset without rows).
    pub fn key_bounds(&self) -> Option<(&[u8], &[u8])> {
        let pages = self.keys.pages();
        (pages > 0).then(|| (self.keys.get(0), self.keys.get(pages)))
    }

    /// All keys, in ordinal order.
    pub fn read_keys(&self) -> Result<BinaryArray, StorageError> {
        let ordinals: Vec<u32> = (0..self.num_rows() as u32).collect();
        self.read_key_rows(&ordinals)
    }

    /// The keys of the rows at `ordinals` (sorted, distinct).
    pub(crate) fn read_key_rows(&self, ordinals: &[u32]) -> Result<BinaryArray, StorageError> {
        read_keys(&self.path, &self.metadata, &self.key_columns, ordinals)
    }

    /// Page `p` of the key column, from `cache` or the file.
    fn key_page(&self, p: usize, cache: &PageCache) -> Result<BinaryArray, StorageError> {
        let id = (self.keys.cache_id, p as u32);
        if let Some(page) = cache
            .get(id)
            .and_then(|p| p.as_binary_opt::<i32>().cloned())
        {
            return Ok(page);
        }
        let (start, end) = (self.keys.starts[p], self.keys.starts[p + 1]);
        let page = self.read_key_rows(&(start..end).collect::<Vec<_>>())?;
        cache.insert(id, Arc::new(page.clone()));
        Ok(page)
    }

    /// The rows that hold `listed` keys, as (start, length) ranges in ascending order: each
    /// whole key's row, found through the key index, or the pages that can hold keys starting
    /// with a listed prefix. None when there are too many keys for the rows
    /// ([`ROWS_PER_LISTED_KEY`]), or the prefixes' pages hold more than a quarter of the rows:
    /// reading every row is then cheaper.
    pub(crate) fn listed_rows(
        &self,
        listed: &ListedKeys,
        cache: &PageCache,
    ) -> Result<Option<Vec<(usize, usize)>>, StorageError> {
        if listed.keys.len().saturating_mul(ROWS_PER_LISTED_KEY) > self.num_rows() {
            return Ok(None);
        }
        if listed.whole {
            return self.rows_of_keys(listed.keys, cache).map(Some);
        }
        let mut rows = Vec::new();
        for key in listed.keys {
            let compare = |k: &[u8]| k[..key.len().min(k.len())].cmp(key);
            let first = self.keys.lower_bound(|k| compare(k).is_lt());
            let end = self.keys.upper_bound(|k| compare(k).is_le());
            if first < end {
                rows.push((first, end - first));
            }
        }
        let n = self.num_rows();
        let outside: usize = gaps(&rows, n).iter().map(|gap| gap.1).sum();
        Ok((n - outside <= n / 4).then_some(rows))
    }

    /// The rows of those of `keys` (sorted, whole keys) that this rowset holds, as (ordinal, 1)
    /// ranges in ascending order. The keys are placed on the pages of the sparse index first; a
    /// page with only a few of them checks each in the bloom filter before it is read (most
    /// keys are absent from most rowsets of a hash-partitioned table), one with more is read
    /// at once, which costs less than their scattered bloom-filter checks.
    fn rows_of_keys(
        &self,
        keys: &[Vec<u8>],
        cache: &PageCache,
    ) -> Result<Vec<(usize, usize)>, StorageError> {
        const FEW: usize = 4;
        let index = &self.keys;
        let pages = index.pages();
        let mut rows = Vec::new();
        if pages == 0 {
            return Ok(rows);
        }
        let mut next = keys.partition_point(|k| k.as_slice() < index.get(0));
        for p in 0..pages {
            // The keys of page p: below the next page's first key, or up to the last key.
            let end = match p + 1 < pages {
                true => next + keys[next..].partition_point(|k| k.as_slice() < index.get(p + 1)),
                false => next + keys[next..].partition_point(|k| k.as_slice() <= index.get(p + 1)),
            };
            let here = &keys[next..end];
            next = end;
            let few = here.len() <= FEW;
            let mut wanted = (here.iter())
                .filter(|k| !few || index.bloom.check(hash_bytes(k)))
                .peekable();
            if wanted.peek().is_none() {
                continue;
            }
            let page = self.key_page(p, cache)?;
            // Each key is searched for after the one before it.
            let mut from = 0;
            for key in wanted {
                from = lower_bound_in(&page, from, key);
                if from < page.len() && page.value(from) == key.as_slice() {
                    rows.push((index.starts[p] as usize + from, 1));
                }
            }
        }
        Ok(rows)
    }

    /// The ordinal of `key` in this rowset; `hash` is its [`hash_bytes`], computed once for all
    /// the rowsets a lookup tries.
    pub fn find(
        &self,
        key: &[u8],
        hash: u64,
        cache: &PageCache,
    ) -> Result<Option<u32>, StorageError> {
        let Some(p) = self.keys.page_of(key, hash) else {
            return Ok(None);
        };
        let page = self.key_page(p, cache)?;
        let i = lower_bound_in(&page, 0, key);
        Ok((i < page.len() && page.value(i) == key).then(|| self.keys.starts[p] + i as u32))
    }
}

/// The position of the first key of `page` (sorted keys) from `from` on that is not below
/// `key`.
fn lower_bound_in(page: &BinaryArray, from: usize, key: &[u8]) -> usize {
    let (mut low, mut high) = (from, page.len());
    while low < high {
        let mid = (low + high) / 2;
        match page.value(mid) < key {
            true => low = mid + 1,
            false => high = mid,
        }
    }
    low
}

/// The keys of the rows at `ordinals` (sorted, distinct) of a rowset file, encoded from its
/// `key_columns` (in key order).
pub(super) fn read_keys(
    path: &Path,
    metadata: &ArrowReaderMetadata,
    key_columns: &[usize],
    ordinals: &[u32],
) -> Result<BinaryArray, StorageError> {
    let mut roots = key_columns.to_vec();
    roots.sort_unstable();
    let batch = read_positions(path, metadata, &roots, ordinals)?;
    // Parquet returns the columns in file order; keys encode them in key order.
    let arrays: Vec<ArrayRef> = (key_columns.iter())
        .map(|c| {
            batch
                .column(roots.binary_search(c).unwrap_or_default())
                .clone()
        })
        .collect();
    let missing = || StorageError::Corruption(format!("{}: a key is missing", path.display()));
    if batch.num_rows() != ordinals.len() {
        return Err(missing());
    }
    let mut keys = arrow::array::BinaryBuilder::with_capacity(ordinals.len(), ordinals.len() * 9);
    let mut key = Vec::new();
    for row in 0..batch.num_rows() {
        if arrays.iter().any(|a| a.is_null(row)) {
            return Err(missing());
        }
        key.clear();
        crate::key::encode_key_columns(&arrays, row, &mut key);
        keys.append_value(&key);
    }
    Ok(keys.finish())
}

/// An iterator that knows its length (for [`KeyIndex::new`] over several arrays).
pub(super) struct ExactLen<I>(pub(super) I, pub(super) usize);

impl<I: Iterator> Iterator for ExactLen<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.0.next();
        self.1 = self.1.saturating_sub(usize::from(item.is_some()));
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.1, Some(self.1))
    }
}

impl<I: Iterator> ExactSizeIterator for ExactLen<I> {}
