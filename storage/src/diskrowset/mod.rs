//! DiskRowSets: immutable columnar files holding flushed rows in primary-key order.
//!
//! A DiskRowSet is one Parquet file (page statistics; per column the encoding and compression
//! of its schema, by default dictionary encoding and LZ4) with the table's columns. The row
//! ordinal in the file identifies a row for its delta store. Keys are encoded from the key
//! columns when read; in memory each rowset keeps a sparse index of its keys and a bloom filter
//! (see [`KeyIndex`]), and its first and last key bound which lookups need it at all.
//!
//! A major delta compaction that rewrites only the columns updates changed adds a
//! [`ColumnFile`]: the new base data of those columns, for the same rows in the same order and
//! row groups. A column is read from the newest file that holds it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryArray, BooleanArray, RecordBatch};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{Field, Schema as ArrowSchema, SchemaRef};
use arrow::error::ArrowError;
use bytes::Bytes;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowFilter, RowSelection, RowSelector,
};
use parquet::arrow::push_decoder::{ParquetPushDecoder, ParquetPushDecoderBuilder};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::{PageIndexPolicy, RowGroupMetaData};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::{ColumnPath, SchemaDescPtr, SchemaDescriptor};
use parquet::DecodeResult;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::FileExt;

pub(crate) use crate::bloom::hash_bytes;
use crate::bloom::SplitBlockFilter;
use crate::cache::KeyCache;
use crate::checksum::ChecksumWriter;
use crate::scan::{predicate_mask, ColumnPredicate, PredicateOp, Scalar};
use crate::{ColumnCompression, ColumnEncoding, ColumnType, Schema, StorageError};

/// Rows per Parquet row group: the unit of statistics pruning, and where a scan may change how
/// it filters.
const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Most rows per data page.
const PAGE_ROWS: usize = 4 * 1024;
/// Largest dictionary page: a column whose values need more falls back to plain encoding for
/// the rest of the row group, so a key lookup never decodes a large dictionary.
const DICTIONARY_BYTES: usize = 64 * 1024;

pub struct DiskRowSet {
    pub id: u64,
    path: PathBuf,
    /// The table's key columns, in key order: keys are encoded from them.
    key_columns: Vec<usize>,
    /// Encoded keys, sorted; position = row ordinal.
    keys: Arc<KeyIndex>,
    /// Newer base data of some columns, oldest first: each column is read from the newest
    /// file that has it, or else from the rowset's file.
    column_files: Vec<Arc<ColumnFile>>,
    bytes: u64,
    /// The file's footer and page index, read once.
    metadata: ArrowReaderMetadata,
    /// CRC32 of the file (None for files written before checksums were recorded).
    pub checksum: Option<u32>,
}

/// What the tablet metadata records of a column file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ColumnFileMeta {
    pub id: u64,
    /// The table columns (positions) the file holds, ascending.
    pub columns: Vec<u32>,
    pub checksum: u32,
}

/// New base data for some columns of a rowset, written by a major delta compaction that
/// rewrote only the columns its REDO records changed: the same rows in the same order, in row
/// groups of the same sizes.
pub struct ColumnFile {
    pub meta: ColumnFileMeta,
    path: PathBuf,
    bytes: u64,
    metadata: ArrowReaderMetadata,
}

impl ColumnFile {
    pub fn file_name(id: u64) -> String {
        format!("columns-{id:010}.parquet")
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn disk_bytes(&self) -> u64 {
        self.bytes
    }

    fn open(dir: &Path, meta: ColumnFileMeta) -> Result<ColumnFile, StorageError> {
        let path = dir.join(Self::file_name(meta.id));
        crate::checksum::verify(&path, meta.checksum)?;
        let file = File::open(&path)?;
        Ok(ColumnFile {
            bytes: file.metadata()?.len(),
            metadata: load_metadata(&file)?,
            meta,
            path,
        })
    }
}

/// The row counts of a file's row groups.
fn row_groups(metadata: &ArrowReaderMetadata) -> Vec<i64> {
    let groups = metadata.metadata().row_groups();
    groups.iter().map(|g| g.num_rows()).collect()
}

pub(crate) fn load_metadata(file: &File) -> Result<ArrowReaderMetadata, StorageError> {
    // The offset index lets the decoder skip pages in which no row is selected.
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    Ok(ArrowReaderMetadata::load(file, options)?)
}

/// A rowset's primary-key index (Kudu's sparse index and bloom filter): in memory, the first
/// key of each page of the (first) key column and the last key, packed into one buffer, and a
/// split-block bloom filter over all keys, so most lookups of a key the rowset does not hold
/// stop at one cache line. A lookup that passes the filter finds the one page that can hold
/// the key by binary search over the first keys, and searches that page, read from the file
/// (see [`DiskRowSet::find`]).
struct KeyIndex {
    /// The first key of each page, then the last key, with the end offset of each.
    bytes: Vec<u8>,
    ends: Vec<u32>,
    /// The ordinal of each page's first row, then the number of rows.
    starts: Vec<u32>,
    bloom: SplitBlockFilter,
    /// Names this index's pages in a [`KeyCache`].
    cache_id: u64,
}

impl KeyIndex {
    /// The index of `keys` (all of them, which must be ascending) in pages starting at
    /// `page_starts` (ascending, the first 0); `what` names the file in errors.
    fn new<'a>(
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

    fn len(&self) -> usize {
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
    fn lower_bound(&self, before: impl Fn(&[u8]) -> bool) -> usize {
        self.starts[self.partition_point(before).saturating_sub(1)] as usize
    }

    /// An ordinal at or after the last key for which `before` (monotone) holds, plus one.
    fn upper_bound(&self, before: impl Fn(&[u8]) -> bool) -> usize {
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

    fn memory_bytes(&self) -> usize {
        self.bytes.capacity()
            + (self.ends.capacity() + self.starts.capacity()) * 4
            + self.bloom.bytes()
    }
}

/// The ordinal of the first row of each page of the file's column `key_column` (the first key
/// column), from its offset index (or of each row group without one).
fn key_page_starts(metadata: &ArrowReaderMetadata, key_column: usize) -> Vec<u32> {
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
    pub fn file_name(id: u64) -> String {
        format!("rowset-{id:010}.parquet")
    }

    /// Writes `batches` (table columns, key order) with their `keys` as rowset `id` in `dir`,
    /// synced to disk, each column with its encoding and compression. The pages of keys go
    /// into `cache`: the rows just written are the likeliest to be looked up.
    pub fn write(
        dir: &Path,
        id: u64,
        table: &Schema,
        batches: &[RecordBatch],
        keys: Vec<Vec<u8>>,
        cache: &KeyCache,
    ) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        let all: Vec<usize> = (0..table.columns().len()).collect();
        let checksum = write_columns(&path, table, &all, batches)?;
        let file = File::open(&path)?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&file)?;
        let key_columns = table.key_columns().to_vec();
        let starts = key_page_starts(&metadata, key_columns[0]);
        let index = KeyIndex::new(keys.iter().map(Vec::as_slice), &starts, &path)?;
        for (p, range) in index.starts.windows(2).enumerate() {
            let page = &keys[range[0] as usize..range[1] as usize];
            cache.insert(
                (index.cache_id, p as u32),
                BinaryArray::from_iter_values(page),
            );
        }
        let keys = index;
        Ok(DiskRowSet {
            id,
            path,
            key_columns,
            keys: Arc::new(keys),
            column_files: Vec::new(),
            bytes,
            metadata,
            checksum: Some(checksum),
        })
    }

    /// Writes new base data for the table columns `columns` (ascending) of this rowset as
    /// column file `id` in `dir`, synced: `batches` hold those columns of every row in order.
    pub fn write_columns(
        &self,
        dir: &Path,
        id: u64,
        table: &Schema,
        columns: &[u32],
        batches: &[RecordBatch],
    ) -> Result<ColumnFile, StorageError> {
        let path = dir.join(ColumnFile::file_name(id));
        let positions: Vec<usize> = columns.iter().map(|&c| c as usize).collect();
        let checksum = write_columns(&path, table, &positions, batches)?;
        let meta = ColumnFileMeta {
            id,
            columns: columns.to_vec(),
            checksum,
        };
        let file = ColumnFile::open(dir, meta)?;
        if row_groups(&file.metadata) != row_groups(&self.metadata) {
            return Err(StorageError::Corruption(format!(
                "{}: row groups differ from the rowset's",
                file.path.display()
            )));
        }
        Ok(file)
    }

    /// This rowset with `file` as the newest base data of its columns. Older column files
    /// whose every column it replaces are left out.
    pub fn with_column_file(&self, file: ColumnFile) -> DiskRowSet {
        let mut column_files: Vec<Arc<ColumnFile>> = self
            .column_files
            .iter()
            .filter(|f| {
                f.meta
                    .columns
                    .iter()
                    .any(|c| !file.meta.columns.contains(c))
            })
            .cloned()
            .collect();
        column_files.push(Arc::new(file));
        DiskRowSet {
            id: self.id,
            path: self.path.clone(),
            key_columns: self.key_columns.clone(),
            keys: self.keys.clone(),
            column_files,
            bytes: self.bytes,
            metadata: self.metadata.clone(),
            checksum: self.checksum,
        }
    }

    pub fn column_files(&self) -> &[Arc<ColumnFile>] {
        &self.column_files
    }

    /// The rowset's files: its own and its column files.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.path.as_path()).chain(self.column_files.iter().map(|f| f.path()))
    }

    /// Where table column `c` is read: the newest column file holding it (None: the rowset's
    /// file) and its index there.
    fn source(&self, c: usize) -> (Option<&ColumnFile>, usize) {
        for file in self.column_files.iter().rev() {
            if let Some(i) = file.meta.columns.iter().position(|&x| x as usize == c) {
                return (Some(file), i);
            }
        }
        (None, c)
    }

    /// The path and metadata of the file holding column `c`.
    fn file_of(&self, c: usize) -> (&Path, &ArrowReaderMetadata) {
        match self.source(c).0 {
            Some(f) => (&f.path, &f.metadata),
            None => (&self.path, &self.metadata),
        }
    }

    /// `columns` (indexes into the table schema) grouped by the file holding them.
    fn by_file(&self, columns: &[usize]) -> Vec<FileColumns<'_>> {
        let mut groups: Vec<(Option<u64>, FileColumns)> = Vec::new();
        for (i, &c) in columns.iter().enumerate() {
            let (file, root) = self.source(c);
            let id = file.map(|f| f.meta.id);
            match groups.iter_mut().find(|g| g.0 == id) {
                Some(g) => g.1.columns.push((i, root)),
                None => {
                    let (path, metadata) = self.file_of(c);
                    let columns = vec![(i, root)];
                    groups.push((
                        id,
                        FileColumns {
                            path,
                            metadata,
                            columns,
                        },
                    ));
                }
            }
        }
        let mut groups: Vec<FileColumns> = groups.into_iter().map(|g| g.1).collect();
        for g in &mut groups {
            // Parquet returns the projected columns in file order.
            g.columns.sort_by_key(|c| c.1);
        }
        groups
    }
}

/// Some columns of a read, all in one file of a rowset.
struct FileColumns<'a> {
    path: &'a Path,
    metadata: &'a ArrowReaderMetadata,
    /// For each column: its index in the columns read, and in the file; in file order.
    columns: Vec<(usize, usize)>,
}

/// Writes the table columns `columns` (`batches` hold them, in order) as a Parquet file at
/// `path`, synced; returns its CRC32.
fn write_columns(
    path: &Path,
    table: &Schema,
    columns: &[usize],
    batches: &[RecordBatch],
) -> Result<u32, StorageError> {
    let file = ChecksumWriter::create(path)?;
    let props = writer_properties(table, columns).build();
    let schema = Arc::new(table.arrow_schema().project(columns)?);
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
    for batch in batches {
        writer.write(&RecordBatch::try_new(
            schema.clone(),
            batch.columns().to_vec(),
        )?)?;
    }
    writer.into_inner()?.finish()
}

/// Writer settings for the table columns `columns`: statistics per page, row groups and pages
/// of fixed row counts, and for each column the encoding and compression of its schema.
fn writer_properties(
    table: &Schema,
    columns: &[usize],
) -> parquet::file::properties::WriterPropertiesBuilder {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::LZ4_RAW)
        .set_dictionary_enabled(true)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        // Small pages: a key lookup decodes one page per column, found by the offset index.
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_dictionary_page_size_limit(DICTIONARY_BYTES);
    for column in columns.iter().map(|&c| &table.columns()[c]) {
        let path = ColumnPath::from(column.name.as_str());
        let encoding = match column.encoding {
            ColumnEncoding::Auto | ColumnEncoding::Dictionary => None,
            ColumnEncoding::Rle if column.column_type != ColumnType::Bool => None,
            ColumnEncoding::Rle => Some(Encoding::RLE),
            ColumnEncoding::Plain => Some(Encoding::PLAIN),
            ColumnEncoding::BitShuffle => Some(Encoding::BYTE_STREAM_SPLIT),
            ColumnEncoding::Delta => Some(Encoding::DELTA_BINARY_PACKED),
            ColumnEncoding::Prefix => Some(Encoding::DELTA_BYTE_ARRAY),
        };
        if let Some(encoding) = encoding {
            props = props
                .set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(path.clone(), encoding);
        }
        let compression = match column.compression {
            ColumnCompression::Default | ColumnCompression::Lz4 => Compression::LZ4_RAW,
            ColumnCompression::None => Compression::UNCOMPRESSED,
            ColumnCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
        };
        props = props.set_column_compression(path, compression);
    }
    props
}

impl DiskRowSet {
    /// Opens rowset `id` of a table with `schema` in `dir` with its column files, checking
    /// each file against its checksum (when the metadata has one) and indexing the keys.
    pub fn open(
        dir: &Path,
        id: u64,
        checksum: Option<u32>,
        column_files: &[ColumnFileMeta],
        schema: &Schema,
    ) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        if let Some(expected) = checksum {
            crate::checksum::verify(&path, expected)?;
        }
        let file = File::open(&path)?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&file)?;
        let key_columns = schema.key_columns().to_vec();
        let rows: i64 = row_groups(&metadata).iter().sum();
        let ordinals: Vec<u32> = (0..rows as u32).collect();
        let all = read_keys(&path, &metadata, &key_columns, &ordinals)?;
        let keys = KeyIndex::new(
            ExactLen(all.iter().flatten(), all.len()),
            &key_page_starts(&metadata, key_columns[0]),
            &path,
        )?;
        let column_files = column_files
            .iter()
            .map(|meta| {
                let file = ColumnFile::open(dir, meta.clone())?;
                match row_groups(&file.metadata) == row_groups(&metadata) {
                    true => Ok(Arc::new(file)),
                    false => Err(StorageError::Corruption(format!(
                        "{}: row groups differ from those of {}",
                        file.path.display(),
                        path.display()
                    ))),
                }
            })
            .collect::<Result<_, StorageError>>()?;
        Ok(DiskRowSet {
            id,
            path,
            key_columns,
            keys: Arc::new(keys),
            column_files,
            bytes,
            metadata,
            checksum,
        })
    }

    pub fn num_rows(&self) -> usize {
        self.keys.len()
    }

    /// Memory held for key lookups.
    pub fn key_index_bytes(&self) -> usize {
        self.keys.memory_bytes()
    }

    /// Bytes on disk of the rowset's file and its column files.
    pub fn disk_bytes(&self) -> u64 {
        self.bytes
            + self
                .column_files
                .iter()
                .map(|f| f.disk_bytes())
                .sum::<u64>()
    }

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
    fn key_page(&self, p: usize, cache: &KeyCache) -> Result<BinaryArray, StorageError> {
        let id = (self.keys.cache_id, p as u32);
        if let Some(page) = cache.get(id) {
            return Ok(page);
        }
        let (start, end) = (self.keys.starts[p], self.keys.starts[p + 1]);
        let page = self.read_key_rows(&(start..end).collect::<Vec<_>>())?;
        cache.insert(id, page.clone());
        Ok(page)
    }

    /// The ordinal of `key` in this rowset; `hash` is its [`hash_bytes`], computed once for all
    /// the rowsets a lookup tries.
    pub fn find(
        &self,
        key: &[u8],
        hash: u64,
        cache: &KeyCache,
    ) -> Result<Option<u32>, StorageError> {
        let Some(p) = self.keys.page_of(key, hash) else {
            return Ok(None);
        };
        let page = self.key_page(p, cache)?;
        let (mut low, mut high) = (0, page.len());
        while low < high {
            let mid = (low + high) / 2;
            match page.value(mid).cmp(key) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Ok(Some(self.keys.starts[p] + mid as u32)),
            }
        }
        Ok(None)
    }

    /// A reader of the table columns `columns` (indexes into `schema`, the predicates'
    /// columns among them), in ordinal order, without the rows at `hidden` (sorted ordinals)
    /// and with `predicates` applied.
    ///
    /// Row groups whose min/max statistics exclude a predicate are skipped unread. When all
    /// the columns are in the rowset's own file, the predicate columns are decoded and
    /// filtered first and the other columns only for the rows that pass (Parquet's late
    /// materialisation, skipping whole pages where none does). The files are opened now, so
    /// the reader keeps working if the rowset is later replaced.
    pub(crate) fn reader(
        &self,
        schema: &Schema,
        columns: &[usize],
        hidden: &[u32],
        predicates: &[ColumnPredicate],
        batch_size: usize,
    ) -> Result<RowsetReader, StorageError> {
        if columns.iter().any(|&c| self.source(c).0.is_some()) {
            return self
                .zip_reader(schema, columns, hidden, predicates, batch_size)
                .map(RowsetReader::Zip);
        }
        let file = File::open(&self.path)?;
        let metadata = self.metadata.clone();
        let parquet_schema = metadata.parquet_schema().clone();
        // Without predicates every row is decoded in order, so hidden rows are cheaper to drop
        // from the decoded batches than to skip one by one in the decoder.
        let drop_after = predicates.is_empty() && !hidden.is_empty();
        let mut skipped: Vec<(usize, usize)> = match drop_after {
            true => Vec::new(),
            false => hidden.iter().map(|&o| (o as usize, 1)).collect(),
        };
        skipped.extend(self.outside_key_range(schema, predicates));
        let mut read_groups = Vec::new();
        let mut start = 0;
        for (g, group) in metadata.metadata().row_groups().iter().enumerate() {
            let rows = group.num_rows() as usize;
            if excluded_by_statistics(schema, g, predicates, &|_| &metadata).unwrap_or(false) {
                skipped.push((start, rows));
            } else {
                read_groups.push(group);
            }
            start += rows;
        }
        // Join filter bounds that every row read is known to be within need no checking, and
        // a join filter that is only bounds then needs no evaluation at all.
        let mut predicates = predicates.to_vec();
        for p in &mut predicates {
            if let PredicateOp::JoinFilter {
                filter,
                check_bounds,
            } = &mut p.op
            {
                if let Some(bounds) = filter.bounds() {
                    let name = &schema.columns()[p.column].name;
                    *check_bounds = !within_bounds(
                        name,
                        metadata.schema(),
                        &parquet_schema,
                        &read_groups,
                        bounds,
                    )
                    .unwrap_or(false);
                }
            }
        }
        predicates.retain(|p| {
            !matches!(&p.op, PredicateOp::JoinFilter { filter, check_bounds: false } if !filter.has_bloom())
        });
        let mut builder = ParquetPushDecoderBuilder::new_with_metadata(metadata)
            .with_projection(ProjectionMask::roots(
                &parquet_schema,
                columns.iter().copied(),
            ))
            .with_batch_size(batch_size.max(1));
        if !skipped.is_empty() {
            builder = builder.with_row_selection(selection(skipped, start));
        }
        let mut reader = FileReader {
            file,
            decoder: None,
            current: None,
            schema: schema.clone(),
            parquet_schema: Arc::new(parquet_schema),
            predicates,
            hidden: drop_after.then(|| hidden.to_vec()),
            next_ordinal: 0,
        };
        reader.decoder = Some(reader.with_filter(builder).build()?);
        Ok(RowsetReader::File(Box::new(reader)))
    }

    /// A reader for [`Self::reader`] of columns from several files: each file is decoded with
    /// the same row selection and their batches zipped; predicates are evaluated on the
    /// zipped rows.
    fn zip_reader(
        &self,
        schema: &Schema,
        columns: &[usize],
        hidden: &[u32],
        predicates: &[ColumnPredicate],
        batch_size: usize,
    ) -> Result<ZipReader, StorageError> {
        let mut skipped: Vec<(usize, usize)> = hidden.iter().map(|&o| (o as usize, 1)).collect();
        skipped.extend(self.outside_key_range(schema, predicates));
        let mut start = 0;
        for (g, group) in self.metadata.metadata().row_groups().iter().enumerate() {
            let rows = group.num_rows() as usize;
            let metadata_of = |c: usize| self.file_of(c).1;
            if excluded_by_statistics(schema, g, predicates, &metadata_of).unwrap_or(false) {
                skipped.push((start, rows));
            }
            start += rows;
        }
        let selection = selection(skipped, start);
        let mut parts = Vec::new();
        for file in self.by_file(columns) {
            let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
                File::open(file.path)?,
                file.metadata.clone(),
            );
            let roots = file.columns.iter().map(|w| w.1);
            let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
            let reader = builder
                .with_projection(mask)
                .with_row_selection(selection.clone())
                .with_batch_size(batch_size.max(1))
                .build()?;
            parts.push(ZipPart {
                reader,
                outputs: file.columns.iter().map(|w| w.0).collect(),
                pending: None,
            });
        }
        Ok(ZipReader {
            parts,
            schema: schema.clone(),
            output: Arc::new(schema.arrow_schema().project(columns)?),
            predicates: predicates.to_vec(),
        })
    }

    /// The (start, length) ranges of rows outside the ordinal range that key predicates allow:
    /// rows a scan does not read at all.
    fn outside_key_range(
        &self,
        schema: &Schema,
        predicates: &[ColumnPredicate],
    ) -> impl Iterator<Item = (usize, usize)> {
        let (first, end) = self.key_range(schema, predicates);
        [(0, first), (end, self.num_rows() - end)]
            .into_iter()
            .filter(|r| r.1 > 0)
    }

    /// The ordinals `[first, end)` outside which no row can pass `predicates`, from `=`, `<`,
    /// `<=`, `>`, `>=` on the first key column, searched in the key index. Used where the first
    /// key column's encoding orders keys on its own: fixed-width types, or a one-column key.
    fn key_range(&self, schema: &Schema, predicates: &[ColumnPredicate]) -> (usize, usize) {
        let n = self.num_rows();
        let first_column = schema.key_columns()[0];
        let column_type = schema.columns()[first_column].column_type;
        let whole_key = schema.key_columns().len() == 1;
        let variable = matches!(
            column_type,
            ColumnType::String | ColumnType::Varchar { .. } | ColumnType::Binary
        );
        if variable && !whole_key {
            return (0, n);
        }
        let arrow_type = column_type.arrow_type();
        let encode = |v: &Scalar| {
            (v.0.data_type() == &arrow_type && v.0.len() == 1 && v.0.is_valid(0)).then(|| {
                let mut bound = Vec::new();
                crate::key::encode_key_columns(std::slice::from_ref(&v.0), 0, &mut bound);
                bound
            })
        };
        // How a key compares with a bound on the first key column.
        let compare = |key: &[u8], bound: &[u8]| match whole_key {
            true => key.cmp(bound),
            false => key[..bound.len().min(key.len())].cmp(bound),
        };
        // Page-exact bounds: the predicates filter the rows of the first and last page.
        let first_at_least = |bound: &[u8]| self.keys.lower_bound(|k| compare(k, bound).is_lt());
        let below = |bound: &[u8]| self.keys.upper_bound(|k| compare(k, bound).is_lt());
        let not_above = |bound: &[u8]| self.keys.upper_bound(|k| compare(k, bound).is_le());
        let (mut first, mut end) = (0, n);
        for p in predicates.iter().filter(|p| p.column == first_column) {
            let (low, high) = match &p.op {
                PredicateOp::Eq(v) => (encode(v), encode(v).map(|b| not_above(&b))),
                PredicateOp::Gt(v) | PredicateOp::GtEq(v) => (encode(v), None),
                PredicateOp::Lt(v) => (None, encode(v).map(|b| below(&b))),
                PredicateOp::LtEq(v) => (None, encode(v).map(|b| not_above(&b))),
                _ => (None, None),
            };
            if let Some(low) = low {
                first = first.max(first_at_least(&low));
            }
            if let Some(high) = high {
                end = end.min(high);
            }
        }
        (first.min(end), end)
    }

    /// Reads the table columns `columns` of the rows at `ordinals` (sorted, distinct).
    pub fn read_rows(
        &self,
        columns: &[usize],
        ordinals: &[u32],
    ) -> Result<RecordBatch, StorageError> {
        let mut arrays: Vec<Option<ArrayRef>> = vec![None; columns.len()];
        let mut fields: Vec<Option<Field>> = vec![None; columns.len()];
        for file in self.by_file(columns) {
            let roots: Vec<usize> = file.columns.iter().map(|w| w.1).collect();
            let batch = read_positions(file.path, file.metadata, &roots, ordinals)?;
            for (j, (i, _)) in file.columns.into_iter().enumerate() {
                arrays[i] = Some(batch.column(j).clone());
                fields[i] = Some(batch.schema().field(j).clone());
            }
        }
        Ok(RecordBatch::try_new_with_options(
            Arc::new(ArrowSchema::new(
                fields.into_iter().flatten().collect::<Vec<_>>(),
            )),
            arrays.into_iter().flatten().collect(),
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(ordinals.len())),
        )?)
    }
}

/// The keys of the rows at `ordinals` (sorted, distinct) of a rowset file, encoded from its
/// `key_columns` (in key order).
fn read_keys(
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

/// Reads the columns `roots` (ascending) of the rows at `positions` (sorted, distinct) of a
/// Parquet file. Only the row groups holding them are read.
pub(crate) fn read_positions(
    path: &Path,
    metadata: &ArrowReaderMetadata,
    roots: &[usize],
    positions: &[u32],
) -> Result<RecordBatch, StorageError> {
    let mut groups = Vec::new();
    let mut selectors = Vec::new();
    let mut group_start = 0u32;
    let mut positions = positions.iter().copied().peekable();
    for (g, group) in metadata.metadata().row_groups().iter().enumerate() {
        let group_end = group_start + group.num_rows() as u32;
        if positions.peek().is_some_and(|&o| o < group_end) {
            groups.push(g);
            // The first row of this group not yet covered by a selector.
            let mut next = group_start;
            while let Some(o) = positions.next_if(|&o| o < group_end) {
                if o > next {
                    selectors.push(RowSelector::skip((o - next) as usize));
                }
                match selectors.last_mut() {
                    Some(last) if !last.skip && o == next => last.row_count += 1,
                    _ => selectors.push(RowSelector::select(1)),
                }
                next = o + 1;
            }
            if group_end > next {
                selectors.push(RowSelector::skip((group_end - next) as usize));
            }
        }
        group_start = group_end;
    }
    let builder =
        ParquetRecordBatchReaderBuilder::new_with_metadata(File::open(path)?, metadata.clone())
            .with_row_groups(groups);
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
    let reader = builder
        .with_projection(mask)
        .with_row_selection(RowSelection::from(selectors))
        .with_batch_size(8 * 1024)
        .build()?;
    let schema = arrow::array::RecordBatchReader::schema(&reader);
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// A selection of `total` rows without the `skipped` (start, length) ranges (in any order,
/// possibly overlapping).
fn selection(mut skipped: Vec<(usize, usize)>, total: usize) -> RowSelection {
    skipped.sort_unstable();
    let mut selectors = Vec::new();
    let mut next = 0;
    for (start, len) in skipped {
        let end = (start + len).min(total);
        if end <= next {
            continue;
        }
        let start = start.max(next);
        if start > next {
            selectors.push(RowSelector::select(start - next));
        }
        selectors.push(RowSelector::skip(end - start));
        next = end;
    }
    if next < total {
        selectors.push(RowSelector::select(total - next));
    }
    RowSelection::from(selectors)
}

/// Whether the min/max statistics of row group `g` prove that no row passes `predicates`;
/// `metadata_of` gives the file that holds a column.
fn excluded_by_statistics<'a>(
    schema: &Schema,
    g: usize,
    predicates: &[ColumnPredicate],
    metadata_of: &dyn Fn(usize) -> &'a ArrowReaderMetadata,
) -> Result<bool, StorageError> {
    for p in predicates {
        let name = &schema.columns()[p.column].name;
        let metadata = metadata_of(p.column);
        let group = &metadata.metadata().row_groups()[g];
        let converter =
            StatisticsConverter::try_new(name, metadata.schema(), metadata.parquet_schema())?;
        let min = converter.row_group_mins([group])?;
        let max = converter.row_group_maxes([group])?;
        if min.null_count() > 0 || max.null_count() > 0 {
            continue;
        }
        let s = |v: &Scalar| arrow::array::Scalar::new(v.0.clone());
        let all = |b: BooleanArray| b.null_count() == 0 && b.true_count() == b.len();
        let excluded = match &p.op {
            PredicateOp::Eq(v) => all(cmp::gt(&min, &s(v))?) || all(cmp::lt(&max, &s(v))?),
            PredicateOp::Lt(v) => all(cmp::gt_eq(&min, &s(v))?),
            PredicateOp::LtEq(v) => all(cmp::gt(&min, &s(v))?),
            PredicateOp::Gt(v) => all(cmp::lt_eq(&max, &s(v))?),
            PredicateOp::GtEq(v) => all(cmp::lt(&max, &s(v))?),
            PredicateOp::InList(values) => {
                let mut outside = true;
                for v in values {
                    outside &= all(cmp::gt(&min, &s(v))?) || all(cmp::lt(&max, &s(v))?);
                }
                outside
            }
            PredicateOp::JoinFilter { filter, .. } => match filter.bounds() {
                Some((low, high)) => all(cmp::lt(&max, &s(low))?) || all(cmp::gt(&min, &s(high))?),
                None => false,
            },
            PredicateOp::IsNull | PredicateOp::IsNotNull => false,
        };
        if excluded {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the statistics of `groups` prove every value of column `name` non-null and within
/// `bounds`.
fn within_bounds(
    name: &str,
    arrow_schema: &ArrowSchema,
    parquet_schema: &SchemaDescriptor,
    groups: &[&RowGroupMetaData],
    (low, high): &(Scalar, Scalar),
) -> Result<bool, StorageError> {
    let converter = StatisticsConverter::try_new(name, arrow_schema, parquet_schema)?;
    let groups = groups.iter().copied();
    let min = converter.row_group_mins(groups.clone())?;
    let max = converter.row_group_maxes(groups.clone())?;
    let nulls = converter.row_group_null_counts(groups)?;
    if min.null_count() > 0 || max.null_count() > 0 || nulls.null_count() > 0 {
        return Ok(false);
    }
    let s = |v: &Scalar| arrow::array::Scalar::new(v.0.clone());
    let all = |b: BooleanArray| b.null_count() == 0 && b.true_count() == b.len();
    Ok(nulls.values().iter().all(|&n| n == 0)
        && all(cmp::gt_eq(&min, &s(low))?)
        && all(cmp::lt_eq(&max, &s(high))?))
}

/// Reads a rowset's base data for a scan (see [`DiskRowSet::reader`]).
pub(crate) enum RowsetReader {
    File(Box<FileReader>),
    Zip(ZipReader),
}

impl Iterator for RowsetReader {
    type Item = Result<RecordBatch, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            RowsetReader::File(r) => r.next(),
            RowsetReader::Zip(r) => r.next(),
        }
    }
}

/// Reads columns of a rowset from several files (see [`DiskRowSet::zip_reader`]).
pub(crate) struct ZipReader {
    parts: Vec<ZipPart>,
    schema: Schema,
    output: SchemaRef,
    predicates: Vec<ColumnPredicate>,
}

struct ZipPart {
    reader: ParquetRecordBatchReader,
    /// The output index of each column of the file's batches.
    outputs: Vec<usize>,
    /// Decoded rows not yet returned.
    pending: Option<RecordBatch>,
}

impl ZipReader {
    /// The next rows of every file, zipped (before predicates); None at the end.
    fn next_zipped(&mut self) -> Result<Option<RecordBatch>, StorageError> {
        let mut n = usize::MAX;
        for part in &mut self.parts {
            if part.pending.as_ref().is_none_or(|b| b.num_rows() == 0) {
                part.pending = part.reader.next().transpose()?;
            }
            n = n.min(part.pending.as_ref().map_or(0, |b| b.num_rows()));
        }
        if n == 0 {
            return match self.parts.iter().any(|p| p.pending.is_some()) {
                true => Err(StorageError::Corruption(
                    "the files of a rowset hold different numbers of rows".into(),
                )),
                false => Ok(None),
            };
        }
        let mut arrays: Vec<Option<ArrayRef>> = vec![None; self.output.fields().len()];
        for part in &mut self.parts {
            if let Some(batch) = part.pending.take() {
                for (j, &o) in part.outputs.iter().enumerate() {
                    arrays[o] = Some(batch.column(j).slice(0, n));
                }
                part.pending = Some(batch.slice(n, batch.num_rows() - n));
            }
        }
        Ok(Some(RecordBatch::try_new_with_options(
            self.output.clone(),
            arrays.into_iter().flatten().collect(),
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        )?))
    }
}

impl Iterator for ZipReader {
    type Item = Result<RecordBatch, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let batch = match self.next_zipped() {
                Ok(Some(batch)) => batch,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            if self.predicates.is_empty() {
                return Some(Ok(batch));
            }
            let filtered = predicate_mask(&self.schema, &self.predicates, &batch)
                .and_then(|mask| Ok(arrow::compute::filter_record_batch(&batch, &mask)?));
            match filtered {
                Ok(b) if b.num_rows() == 0 => continue,
                other => return Some(other),
            }
        }
    }
}

/// Decodes a rowset for a scan one row group at a time, so that between row groups it can drop
/// predicates that stopped paying (join filters that switched themselves off). Predicates run
/// as a Parquet row filter: their columns are decoded first (and kept for the output), the other
/// columns only for the rows and pages that pass.
pub(crate) struct FileReader {
    file: File,
    decoder: Option<ParquetPushDecoder>,
    current: Option<ParquetRecordBatchReader>,
    schema: Schema,
    parquet_schema: SchemaDescPtr,
    predicates: Vec<ColumnPredicate>,
    /// Ordinals to drop from the decoded batches (sorted), when every row is decoded in order;
    /// and the ordinal of the next row decoded.
    hidden: Option<Vec<u32>>,
    next_ordinal: u64,
}

impl FileReader {
    /// `batch` (the next rows in ordinal order) without the hidden rows.
    fn drop_hidden(&mut self, batch: RecordBatch) -> Result<RecordBatch, StorageError> {
        let Some(hidden) = &self.hidden else {
            return Ok(batch);
        };
        let n = batch.num_rows();
        let start = self.next_ordinal;
        self.next_ordinal += n as u64;
        let from = hidden.partition_point(|&o| u64::from(o) < start);
        let to = hidden.partition_point(|&o| u64::from(o) < start + n as u64);
        if from == to {
            return Ok(batch);
        }
        let mut keep = arrow::array::BooleanBufferBuilder::new(n);
        keep.append_n(n, true);
        for &o in &hidden[from..to] {
            keep.set_bit((u64::from(o) - start) as usize, false);
        }
        let mask = BooleanArray::new(keep.finish(), None);
        Ok(arrow::compute::filter_record_batch(&batch, &mask)?)
    }

    fn with_filter(&self, builder: ParquetPushDecoderBuilder) -> ParquetPushDecoderBuilder {
        if self.predicates.is_empty() {
            return builder.with_row_filter(RowFilter::new(vec![]));
        }
        let mut predicate_columns: Vec<usize> = self.predicates.iter().map(|p| p.column).collect();
        predicate_columns.sort_unstable();
        predicate_columns.dedup();
        let schema = self.schema.clone();
        let predicates = self.predicates.clone();
        let filter = ArrowPredicateFn::new(
            ProjectionMask::roots(&self.parquet_schema, predicate_columns),
            move |batch| {
                predicate_mask(&schema, &predicates, &batch)
                    .map_err(|e| ArrowError::ExternalError(Box::new(e)))
            },
        );
        builder.with_row_filter(RowFilter::new(vec![Box::new(filter)]))
    }

    /// Between row groups: rebuilds the decoder without bloom filters that switched off.
    fn adapt(&mut self) -> Result<(), StorageError> {
        let switched_off = |p: &ColumnPredicate| matches!(&p.op, PredicateOp::JoinFilter { filter, .. } if filter.stats.disabled());
        let Some(decoder) = self
            .decoder
            .take_if(|d| d.is_at_row_group_boundary() && d.row_groups_remaining() > 0)
        else {
            return Ok(());
        };
        if !self.predicates.iter().any(switched_off) {
            self.decoder = Some(decoder);
            return Ok(());
        }
        self.predicates.retain(|p| !switched_off(p));
        let builder = decoder.into_builder()?;
        self.decoder = Some(self.with_filter(builder).build()?);
        Ok(())
    }

    fn next_row_group(&mut self) -> Result<bool, StorageError> {
        loop {
            self.adapt()?;
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(false);
            };
            match decoder.try_next_reader()? {
                DecodeResult::NeedsData(ranges) => {
                    let data = ranges
                        .iter()
                        .map(|r| {
                            let mut buf = vec![0; (r.end - r.start) as usize];
                            self.file
                                .read_exact_at(&mut buf, r.start)
                                .map(|()| Bytes::from(buf))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    decoder.push_ranges(ranges, data)?;
                }
                DecodeResult::Data(reader) => {
                    self.current = Some(reader);
                    return Ok(true);
                }
                DecodeResult::Finished => {
                    self.decoder = None;
                    return Ok(false);
                }
            }
        }
    }
}

impl Iterator for FileReader {
    type Item = Result<RecordBatch, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(batch) = self.current.as_mut().and_then(Iterator::next) {
                return Some(
                    batch
                        .map_err(StorageError::from)
                        .and_then(|b| self.drop_hidden(b)),
                );
            }
            self.current = None;
            match self.next_row_group() {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => {
                    self.decoder = None;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// An iterator that knows its length (for [`KeyIndex::new`] over several arrays).
struct ExactLen<I>(I, usize);

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
