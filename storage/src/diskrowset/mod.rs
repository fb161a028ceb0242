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
//!
//! The files of this module: `column_file.rs` (column files, and which file a column is read
//! from), `key_index.rs` (the key index and key lookups) and `reader.rs` (scans of the base
//! data: pruning by statistics and key range, late materialisation).

mod column_file;
mod key_index;
mod reader;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::PageIndexPolicy;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

pub(crate) use crate::bloom::hash_bytes;
pub use column_file::{ColumnFile, ColumnFileMeta};
pub(crate) use reader::{RowsRead, RowsetReader};

use crate::cache::PageCache;
use crate::checksum::ChecksumWriter;
use crate::column_map::ColumnMap;
use crate::{ColumnCompression, ColumnEncoding, ColumnType, Schema, StorageError};
use key_index::{key_page_starts, read_keys, ExactLen, KeyIndex};

/// Rows per Parquet row group: the unit of statistics pruning, and where a scan may change how
/// it filters.
const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Most rows per data page.
const PAGE_ROWS: usize = 4 * 1024;
/// Data pages end once their values take this many bytes (give or take one write batch of
/// [`WRITE_BATCH_ROWS`]): a key lookup decompresses and decodes one page per column it returns,
/// so wide values (100-byte strings fill 4 096 rows with 400 KB) make smaller pages.
const PAGE_BYTES: usize = 64 * 1024;
/// Rows the Parquet writer encodes at once, between its checks of the page size.
const WRITE_BATCH_ROWS: usize = 256;
/// Largest dictionary page: a column whose values need more falls back to plain encoding for
/// the rest of the row group, so a key lookup never decodes a large dictionary.
const DICTIONARY_BYTES: usize = 64 * 1024;

/// An immutable rowset on disk: rows in key order, identified by their ordinal, with the key
/// index in memory (see the module documentation). Its history lives beside it, in the
/// tablet's [`RowsetDeltas`](crate::delta::RowsetDeltas) for it.
///
/// ```ignore
/// # // Not compiled: a doctest cannot reach this crate-private type.
/// let rowset = DiskRowSet::write(dir, id, &schema, &batches, keys, &cache)?; // or ::open
/// if let Some(ordinal) = rowset.find(&key, hash_bytes(&key), &cache)? {
///     let row = rowset.read_rows(&columns, &[ordinal])?; // a few rows by ordinal
/// }
/// let rows = RowsRead { hidden: &hidden, within: None }; // all but `hidden`
/// let scan = rowset.reader(&schema, &columns, rows, &predicates, 1024, false)?;
/// ```
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
    /// The id of the file's data pages in the page cache.
    cache_id: u64,
    /// CRC32 of the file (None for files written before checksums were recorded).
    pub checksum: Option<u32>,
    /// What the files' statistics say of each column, worked out when first asked.
    ranges: std::sync::OnceLock<Vec<ColumnRange>>,
    /// The columns of the rowset's files, when they were written under an older schema than
    /// the table's (see [`crate::column_map`]); its column files hold the same.
    written: Option<Arc<Written>>,
}

/// The columns of a rowset written under an older schema, and how they map onto the table's.
pub(crate) struct Written {
    /// The columns as the files hold them (positions, names), keyed as the table is.
    pub(crate) schema: Schema,
    pub(crate) map: Arc<ColumnMap>,
}

/// What Parquet statistics say of one column's values: its smallest and largest (one-element
/// arrays of the column's type) and how many are NULL; None where the files do not say. They
/// describe base data: updates kept in delta files may lie outside.
#[derive(Clone, Debug, Default)]
pub struct ColumnRange {
    pub min: Option<ArrayRef>,
    pub max: Option<ArrayRef>,
    pub null_count: Option<u64>,
}

impl ColumnRange {
    /// The range of a column's row groups in a file, from their statistics.
    fn of_file(metadata: &ArrowReaderMetadata, position: usize) -> Self {
        let schema = metadata.schema();
        let Some(field) = schema.fields().get(position) else {
            return Self::default();
        };
        let parquet = metadata.metadata();
        let Ok(converter) = StatisticsConverter::try_new(
            field.name(),
            schema,
            parquet.file_metadata().schema_descr(),
        ) else {
            return Self::default();
        };
        let groups = parquet.row_groups();
        let extreme = |values: parquet::errors::Result<ArrayRef>, descending| {
            values.ok().and_then(|v| extreme(&[v], descending))
        };
        let null_count = converter
            .row_group_null_counts(groups)
            .ok()
            .filter(|counts| counts.null_count() == 0)
            .map(|counts| counts.values().iter().sum());
        Self {
            min: extreme(converter.row_group_mins(groups), false),
            max: extreme(converter.row_group_maxes(groups), true),
            null_count,
        }
    }

    /// The range of several sets of values together.
    pub fn merge_all<'a>(ranges: impl Iterator<Item = &'a ColumnRange>) -> ColumnRange {
        let ranges: Vec<&ColumnRange> = ranges.collect();
        let all = |pick: fn(&ColumnRange) -> &Option<ArrayRef>| {
            ranges
                .iter()
                .map(|r| pick(r).clone())
                .collect::<Option<Vec<ArrayRef>>>()
        };
        ColumnRange {
            min: all(|r| &r.min).and_then(|values| extreme(&values, false)),
            max: all(|r| &r.max).and_then(|values| extreme(&values, true)),
            null_count: ranges.iter().map(|r| r.null_count).sum(),
        }
    }
}

/// The smallest (or with `descending` the largest) non-null value among `arrays`, as a
/// one-element array; None if there is none, or a row group lacks the statistic.
fn extreme(arrays: &[ArrayRef], descending: bool) -> Option<ArrayRef> {
    if arrays.iter().any(|a| a.null_count() > 0) {
        return None;
    }
    let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
    let values = arrow::compute::concat(&refs).ok()?;
    let options = arrow::compute::SortOptions {
        descending,
        nulls_first: false,
    };
    let first = arrow::compute::sort_to_indices(&values, Some(options), Some(1)).ok()?;
    (!first.is_empty()).then(|| arrow::compute::take(&values, &first, None).ok())?
}

/// The columns of a rowset file (`metadata`, at `path`) holding the columns with ids `ids`,
/// as a table with schema `table` reads them; None if they are the table's.
fn written_columns(
    path: &Path,
    metadata: &ArrowReaderMetadata,
    table: &Arc<Schema>,
    ids: &[u32],
) -> Result<Option<Arc<Written>>, StorageError> {
    let fields: Vec<&Field> = metadata
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref())
        .collect();
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    let Some(map) = ColumnMap::new(ids, &names, table) else {
        return Ok(None);
    };
    let schema = crate::column_map::written_schema(table, ids, &fields)
        .map_err(|e| StorageError::Corruption(format!("{}: {e}", path.display())))?;
    Ok(Some(Arc::new(Written { schema, map })))
}

/// The row counts of a file's row groups.
fn row_groups(metadata: &ArrowReaderMetadata) -> Vec<i64> {
    let groups = metadata.metadata().row_groups();
    groups.iter().map(|g| g.num_rows()).collect()
}

/// The footer of the Parquet file `file` (at `path`): its metadata and Arrow schema.
pub(crate) fn load_metadata(path: &Path, file: &File) -> Result<ArrowReaderMetadata, StorageError> {
    // The offset index lets the decoder skip pages in which no row is selected.
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    let metadata = guard(path, || Ok(ArrowReaderMetadata::load(file, options)?))?;
    // Row ordinals are u32: row counts beyond that (or below 0) are damage.
    let counts = metadata
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows());
    if counts.clone().any(|n| n < 0) || counts.sum::<i64>() > u32::MAX as i64 {
        return Err(StorageError::Corruption(format!(
            "{}: impossible row counts",
            path.display()
        )));
    }
    Ok(metadata)
}

/// Runs `read`, a call into the Parquet reader (and the Arrow IPC decoder it uses for the
/// schema in the footer) on the bytes of the file at `path`, turning a panic into
/// [`StorageError::Corruption`]. Those readers panic on some damaged input instead of failing —
/// seen: arrow-ipc 59's `Int type with bit width of 2097216 and signed of true not supported`
/// (`convert.rs`) for a damaged `ARROW:schema` in the footer — and a damaged file must be an
/// error, not a dead server. (Checksums catch damage on disk; this covers what they cannot: a
/// file damaged before it was checksummed, or written before checksums were recorded.)
pub(crate) fn guard<T>(
    path: &Path,
    read: impl FnOnce() -> Result<T, StorageError>,
) -> Result<T, StorageError> {
    crate::panics::catch_quietly(read).unwrap_or_else(|panic| {
        Err(StorageError::Corruption(format!(
            "{} cannot be read: {}",
            path.display(),
            crate::panics::panic_message(panic.as_ref())
        )))
    })
}

/// Checks that the file at `path` holds columns of the types `expected` has, in its order.
/// The tablet metadata says what each file holds; a file that holds something else (damaged,
/// or not written for this schema) is an error here, not a panic where a column is read as the
/// type it should have.
pub(crate) fn check_columns(
    path: &Path,
    metadata: &ArrowReaderMetadata,
    expected: &ArrowSchema,
) -> Result<(), StorageError> {
    let types = |schema: &ArrowSchema| -> Vec<DataType> {
        schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect()
    };
    if types(metadata.schema()) != types(expected) {
        return Err(StorageError::Corruption(format!(
            "{} does not hold the columns the tablet metadata says it holds",
            path.display()
        )));
    }
    Ok(())
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
        cache: &PageCache,
    ) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        let all: Vec<usize> = (0..table.columns().len()).collect();
        let checksum = write_columns(&path, table, &all, batches)?;
        let file = File::open(&path).map_err(StorageError::on(&path))?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&path, &file)?;
        let key_columns = table.key_columns().to_vec();
        let starts = key_page_starts(&metadata, key_columns[0]);
        let index = KeyIndex::new(keys.iter().map(Vec::as_slice), &starts, &path)?;
        for (p, range) in index.starts.windows(2).enumerate() {
            let page = &keys[range[0] as usize..range[1] as usize];
            cache.insert(
                (index.cache_id, p as u32),
                Arc::new(BinaryArray::from_iter_values(page)),
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
            cache_id: crate::cache::next_index_id(),
            checksum: Some(checksum),
            ranges: Default::default(),
            written: None,
        })
    }

    /// The rowset's files: its own and its column files.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.path.as_path()).chain(self.column_files.iter().map(|f| f.path()))
    }

    /// Opens rowset `id` of a table with schema `table` in `dir` with its column files,
    /// checking each file against its checksum (when the metadata has one) and indexing the
    /// keys. `column_ids`: the ids of the columns its files hold, if it was written under an
    /// older schema (else they hold the table's).
    pub fn open(
        dir: &Path,
        id: u64,
        checksum: Option<u32>,
        column_files: &[ColumnFileMeta],
        table: &Arc<Schema>,
        column_ids: Option<&[u32]>,
    ) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        if let Some(expected) = checksum {
            crate::checksum::verify(&path, expected)?;
        }
        let file = File::open(&path).map_err(StorageError::on(&path))?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&path, &file)?;
        let written = match column_ids {
            Some(ids) => written_columns(&path, &metadata, table, ids)?,
            None => None,
        };
        let schema = written.as_ref().map_or(table.as_ref(), |w| &w.schema);
        check_columns(&path, &metadata, &schema.arrow_schema())?;
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
                let file = ColumnFile::open(dir, meta.clone(), schema)?;
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
            cache_id: crate::cache::next_index_id(),
            checksum,
            ranges: Default::default(),
            written,
        })
    }

    /// This rowset, read under the table's schema `current`, as a table with schema `table`
    /// reads it: its files keep their columns, mapped onto the table's by id (a schema change
    /// rewrites no file).
    pub fn for_table(
        &self,
        current: &Schema,
        table: &Arc<Schema>,
    ) -> Result<DiskRowSet, StorageError> {
        let ids = self.column_ids(current);
        Ok(DiskRowSet {
            id: self.id,
            path: self.path.clone(),
            key_columns: self.key_columns.clone(),
            keys: self.keys.clone(),
            column_files: self.column_files.clone(),
            bytes: self.bytes,
            metadata: self.metadata.clone(),
            cache_id: self.cache_id,
            checksum: self.checksum,
            ranges: Default::default(),
            written: written_columns(&self.path, &self.metadata, table, &ids)?,
        })
    }

    /// The ids of the columns the rowset's files hold; `table` is the table's schema while
    /// they hold its columns.
    pub fn column_ids(&self, table: &Schema) -> Vec<u32> {
        match &self.written {
            Some(w) => w.schema.ids(),
            None => table.ids(),
        }
    }

    /// Whether the files hold other columns than the table's (written under an older schema).
    pub fn is_written_under_older_schema(&self) -> bool {
        self.written.is_some()
    }

    pub(crate) fn written(&self) -> Option<&Arc<Written>> {
        self.written.as_ref()
    }

    /// What the statistics of its files say of each of the table's `columns` columns: from the
    /// newest column file holding a column, else from the rowset's own file.
    pub fn column_ranges(&self, columns: usize) -> &[ColumnRange] {
        self.ranges.get_or_init(|| {
            (0..columns)
                .map(|c| match &self.written {
                    Some(w) => w.map.source(c),
                    None => Some(c),
                })
                .map(|c| {
                    let Some(c) = c else {
                        return ColumnRange::default();
                    };
                    let newest = self.column_files.iter().rev().find_map(|f| {
                        let position = f.meta.columns.iter().position(|&k| k as usize == c)?;
                        Some((&f.metadata, position))
                    });
                    let (metadata, position) = newest.unwrap_or((&self.metadata, c));
                    ColumnRange::of_file(metadata, position)
                })
                .collect()
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

    /// Reads the table columns `columns` of the rows at `ordinals` (sorted, distinct).
    pub fn read_rows(
        &self,
        columns: &[usize],
        ordinals: &[u32],
    ) -> Result<RecordBatch, StorageError> {
        match &self.written {
            Some(w) => {
                let read = self.read_file_rows(&w.map.file_columns(columns), ordinals)?;
                w.map.to_table(&read, columns, false)
            }
            None => self.read_file_rows(columns, ordinals),
        }
    }

    /// [`Self::read_rows`] of the columns at `columns` of the files.
    fn read_file_rows(
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
        batch_of(fields, arrays, ordinals.len())
    }

    /// Reads the table columns `columns` of the row at `ordinal` (a key lookup's) from the data
    /// pages holding it, which `cache` keeps decoded: a row read once is likely to be read
    /// again, and a page read again costs no decompression or decoding.
    pub fn read_row(
        &self,
        columns: &[usize],
        ordinal: u32,
        cache: &PageCache,
    ) -> Result<RecordBatch, StorageError> {
        match &self.written {
            Some(w) => {
                let read = self.read_file_row(&w.map.file_columns(columns), ordinal, cache)?;
                w.map.to_table(&read, columns, false)
            }
            None => self.read_file_row(columns, ordinal, cache),
        }
    }

    /// [`Self::read_row`] of the columns at `columns` of the files.
    fn read_file_row(
        &self,
        columns: &[usize],
        ordinal: u32,
        cache: &PageCache,
    ) -> Result<RecordBatch, StorageError> {
        let mut arrays: Vec<Option<ArrayRef>> = vec![None; columns.len()];
        let mut fields: Vec<Option<Field>> = vec![None; columns.len()];
        for file in self.by_file(columns) {
            for (i, root) in file.columns.iter().copied() {
                let page = match page_holding(file.metadata, file.cache_id, root, ordinal) {
                    Some(page) => page,
                    // (No page index: the row alone.)
                    None => PageOfRow {
                        id: None,
                        rows: ordinal..ordinal + 1,
                    },
                };
                let cached = page.id.and_then(|id| cache.get(id));
                let values = match cached {
                    Some(values) => values,
                    None => {
                        let rows: Vec<u32> = page.rows.clone().collect();
                        let values = read_positions(file.path, file.metadata, &[root], &rows)?;
                        let values = values.column(0).clone();
                        if let Some(id) = page.id {
                            cache.insert(id, values.clone());
                        }
                        values
                    }
                };
                let field = file.metadata.schema().field(root).clone();
                arrays[i] = Some(values.slice((ordinal - page.rows.start) as usize, 1));
                fields[i] = Some(field);
            }
        }
        batch_of(fields, arrays, 1)
    }
}

/// The batch of `rows` rows of the columns read (each column's field and values, in the order
/// asked for).
fn batch_of(
    fields: Vec<Option<Field>>,
    arrays: Vec<Option<ArrayRef>>,
    rows: usize,
) -> Result<RecordBatch, StorageError> {
    let schema = ArrowSchema::new(fields.into_iter().flatten().collect::<Vec<_>>());
    Ok(RecordBatch::try_new_with_options(
        Arc::new(schema),
        arrays.into_iter().flatten().collect(),
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

/// The data page of a column holding a row: its rows (file ordinals) and its id in the page
/// cache (None where it has none).
struct PageOfRow {
    id: Option<crate::cache::PageId>,
    rows: std::ops::Range<u32>,
}

/// The data page of the column at `position` of a file (with `metadata`, whose pages are
/// `file` in the page cache) that holds row `ordinal`, from the file's offset index; None
/// without one, or where columns are not leaves.
fn page_holding(
    metadata: &ArrowReaderMetadata,
    file: u64,
    position: usize,
    ordinal: u32,
) -> Option<PageOfRow> {
    let parquet = metadata.metadata();
    let index = parquet.offset_index()?;
    let leaves = parquet.file_metadata().schema_descr().num_columns();
    if leaves != metadata.schema().fields().len() {
        return None;
    }
    let (mut group_start, mut pages_before) = (0u32, 0usize);
    for (group, pages) in parquet.row_groups().iter().zip(index) {
        let group_rows = u32::try_from(group.num_rows()).ok()?;
        let locations = pages.get(position)?.page_locations();
        if ordinal >= group_start + group_rows {
            group_start += group_rows;
            pages_before += locations.len();
            continue;
        }
        let row = i64::from(ordinal - group_start);
        let p = locations
            .partition_point(|l| l.first_row_index <= row)
            .checked_sub(1)?;
        let first = u32::try_from(locations[p].first_row_index).ok()?;
        let end = match locations.get(p + 1) {
            Some(next) => u32::try_from(next.first_row_index).ok()?,
            None => group_rows,
        };
        return Some(PageOfRow {
            id: crate::cache::data_page(file, position, pages_before + p),
            rows: group_start + first..group_start + end,
        });
    }
    None
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
    let props = writer_properties(table, columns, batches).build();
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

/// Writer settings for the table columns `columns` (`batches` hold them, in order):
/// statistics per page, row groups and pages of fixed row counts, and for each column the
/// encoding and compression of its schema.
fn writer_properties(
    table: &Schema,
    columns: &[usize],
    batches: &[RecordBatch],
) -> parquet::file::properties::WriterPropertiesBuilder {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::LZ4_RAW)
        .set_dictionary_enabled(true)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        // Small pages: a key lookup decodes one page per column, found by the offset index.
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_data_page_size_limit(PAGE_BYTES)
        .set_write_batch_size(WRITE_BATCH_ROWS)
        .set_dictionary_page_size_limit(DICTIONARY_BYTES);
    for (i, column) in columns.iter().map(|&c| &table.columns()[c]).enumerate() {
        let path = ColumnPath::from(column.name.as_str());
        let encoding = match column.encoding {
            // Integers (dates, timestamps and decimals of up to 18 digits among them) with more
            // distinct values than a dictionary page holds are delta-encoded: keys and other
            // ordered or narrow values take a few bits each, and pages shrink to a fraction of
            // the plain ones a full dictionary falls back to (less to decompress and decode).
            // Other values too varied for a dictionary are written plain from the start, not
            // after a full dictionary page that every lookup would decode.
            ColumnEncoding::Auto if outgrows_dictionary(batches.iter().map(|b| b.column(i))) => {
                match delta_encodes(&column.column_type) {
                    true => Some(Encoding::DELTA_BINARY_PACKED),
                    false => Some(Encoding::PLAIN),
                }
            }
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
            // Plain values that LZ4 does not shrink (random, encrypted or compressed ones)
            // are stored as they are: compressing them cost every flush and merge time for
            // nothing.
            ColumnCompression::Default
                if encoding == Some(Encoding::PLAIN)
                    && !lz4_shrinks(batches.iter().map(|b| b.column(i))) =>
            {
                Compression::UNCOMPRESSED
            }
            ColumnCompression::Default | ColumnCompression::Lz4 => Compression::LZ4_RAW,
            ColumnCompression::None => Compression::UNCOMPRESSED,
            ColumnCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
        };
        props = props.set_column_compression(path, compression);
    }
    props
}

/// Whether LZ4 shrinks the first [`PAGE_BYTES`] of a column's values (its arrays, in order) by
/// an eighth or more, as the Raft log judges its entries. Strings and binary values and
/// fixed-width ones are sampled; other types are assumed to shrink.
fn lz4_shrinks<'a>(arrays: impl Iterator<Item = &'a ArrayRef>) -> bool {
    let mut sample = Vec::with_capacity(PAGE_BYTES);
    for array in arrays {
        let data = array.to_data();
        let values = match (array.data_type(), data.buffers()) {
            (DataType::Utf8 | DataType::Binary, [offsets, values]) => {
                let offsets =
                    ScalarBuffer::<i32>::new(offsets.clone(), data.offset(), data.len() + 1);
                let (start, end) = (offsets[0] as usize, offsets[data.len()] as usize);
                &values[start..end]
            }
            (t, [values]) if t.primitive_width().is_some() => {
                let width = t.primitive_width().unwrap_or(1);
                &values[data.offset() * width..(data.offset() + data.len()) * width]
            }
            _ => return true,
        };
        let take = values.len().min(PAGE_BYTES - sample.len());
        sample.extend_from_slice(&values[..take]);
        if sample.len() == PAGE_BYTES {
            break;
        }
    }
    sample.is_empty() || 8 * lz4_flex::block::compress(&sample).len() <= 7 * sample.len()
}

/// Whether Parquet stores values of `column_type` as integers (which delta encoding takes).
fn delta_encodes(column_type: &ColumnType) -> bool {
    match column_type {
        ColumnType::Int8
        | ColumnType::Int16
        | ColumnType::Int32
        | ColumnType::Int64
        | ColumnType::Date
        | ColumnType::Timestamp => true,
        ColumnType::Decimal { precision, .. } => *precision <= 18,
        _ => false,
    }
}

/// Whether the first row group's values of a column (its arrays, in order) are too many
/// distinct ones for a dictionary page: the writer would fill one and fall back, and every key
/// lookup would decode that page before the one holding its row. Strings and binary values
/// and fixed-width ones are counted; other types never are.
fn outgrows_dictionary<'a>(arrays: impl Iterator<Item = &'a ArrayRef>) -> bool {
    // (A fast hash: SipHash of every value was a twentieth of a bulk load's flushes.)
    let mut distinct = std::collections::HashSet::<Vec<u8>, foldhash::fast::RandomState>::default();
    let (mut bytes, mut seen) = (0, 0);
    // Some(answer) once the values decide it.
    let mut add = |value: &[u8], cost: usize| {
        if !distinct.contains(value) {
            distinct.insert(value.to_vec());
            bytes += cost;
            if bytes > DICTIONARY_BYTES {
                return Some(true);
            }
        }
        seen += 1;
        (seen == ROW_GROUP_ROWS).then_some(false)
    };
    for array in arrays {
        let data = array.to_data();
        let decided = match (array.data_type(), data.buffers()) {
            (DataType::Utf8 | DataType::Binary, [offsets, values]) => {
                let offsets =
                    ScalarBuffer::<i32>::new(offsets.clone(), data.offset(), data.len() + 1);
                // A dictionary page stores each value with its 4-byte length.
                (offsets.windows(2)).find_map(|w| {
                    let (start, end) = (w[0] as usize, w[1] as usize);
                    add(&values[start..end], end - start + 4)
                })
            }
            (t, [values]) if t.primitive_width().is_some_and(|w| w <= 16) => {
                let width = t.primitive_width().unwrap_or(16);
                let values = &values[data.offset() * width..];
                (values.chunks_exact(width).take(data.len())).find_map(|v| add(v, width))
            }
            _ => return false,
        };
        if let Some(outgrows) = decided {
            return outgrows;
        }
    }
    false
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
    guard(path, || {
        let reader = builder
            .with_projection(mask)
            .with_row_selection(RowSelection::from(selectors))
            .with_batch_size(8 * 1024)
            .build()?;
        let schema = arrow::array::RecordBatchReader::schema(&reader);
        let batches = reader.collect::<Result<Vec<_>, _>>()?;
        Ok(arrow::compute::concat_batches(&schema, &batches)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ColumnSchema;
    use arrow::array::{BinaryArray, Int32Array, Int64Array, StringArray};

    /// Integers with more distinct values than a dictionary page holds are delta-encoded:
    /// ordered keys take a fraction of a byte each, uncompressed. Fewer keep their dictionary.
    #[test]
    fn integers_beyond_the_dictionary_are_delta_encoded() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("s", ColumnType::String, true),
                ColumnSchema::new("q", ColumnType::Int32, false),
            ],
            vec![0],
        )
        .unwrap();
        let rows = 100_000;
        let batch = RecordBatch::try_new(
            schema.arrow_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i * 3))),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("s{}", i % 5)),
                )),
                Arc::new(Int32Array::from_iter_values(
                    (0..rows).map(|i| (i % 50) as i32),
                )),
            ],
        )
        .unwrap();
        let path = dir.path().join("r.parquet");
        write_columns(&path, &schema, &[0, 1, 2], &[batch]).unwrap();
        let metadata = load_metadata(&path, &File::open(&path).unwrap()).unwrap();
        let mut key_bytes = 0;
        for group in metadata.metadata().row_groups() {
            let k = group.column(0);
            assert!(
                k.encodings().any(|e| e == Encoding::DELTA_BINARY_PACKED),
                "{:?}",
                k.encodings().collect::<Vec<_>>()
            );
            key_bytes += k.uncompressed_size();
            let q: Vec<Encoding> = group.column(2).encodings().collect();
            assert!(q.contains(&Encoding::RLE_DICTIONARY), "{q:?}");
            assert!(!q.contains(&Encoding::DELTA_BINARY_PACKED), "{q:?}");
        }
        assert!(
            key_bytes < rows / 2,
            "{key_bytes} bytes of keys for {rows} rows"
        );
    }

    /// A row read by a key lookup comes from its data pages, kept decoded in the page cache:
    /// the same values as a plain read, in any row group and page, for any columns; a page
    /// read again costs nothing more.
    #[test]
    fn a_looked_up_row_is_read_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("body", ColumnType::String, true),
                ColumnSchema::new("n", ColumnType::Int32, true),
            ],
            vec![0],
        )
        .unwrap();
        let rows = ROW_GROUP_ROWS as i64 + 5_000;
        let batch = RecordBatch::try_new(
            schema.arrow_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows)),
                Arc::new(StringArray::from_iter(
                    (0..rows).map(|i| (i % 7 != 0).then(|| format!("{i:080}"))),
                )),
                Arc::new(Int32Array::from_iter(
                    (0..rows).map(|i| Some(i as i32 % 1000)),
                )),
            ],
        )
        .unwrap();
        let keys = crate::encode_keys(&schema, &batch).unwrap();
        let cache = PageCache::new(64 << 20);
        let rowset = DiskRowSet::write(dir.path(), 1, &schema, &[batch], keys, &cache).unwrap();
        let ordinals = [
            0,
            1,
            4_095,
            4_096,
            30_001,
            ROW_GROUP_ROWS as u32,
            rows as u32 - 1,
        ];
        for columns in [vec![0, 1, 2], vec![2, 1], vec![1]] {
            for &ordinal in &ordinals {
                let expected = rowset.read_rows(&columns, &[ordinal]).unwrap();
                let before = cache.bytes();
                assert_eq!(
                    rowset.read_row(&columns, ordinal, &cache).unwrap(),
                    expected
                );
                let after = cache.bytes();
                assert_eq!(
                    rowset.read_row(&columns, ordinal, &cache).unwrap(),
                    expected
                );
                assert_eq!(cache.bytes(), after, "a second read finds its pages");
                if columns.len() == 3 && ordinal == 30_001 {
                    assert!(after > before, "the pages read are kept");
                }
            }
        }
    }

    /// Wide values make small pages (a key lookup decodes one per column), narrow ones keep
    /// the row limit; strings too varied for a dictionary have none.
    #[test]
    fn pages_end_at_a_byte_size_or_a_row_count() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("body", ColumnType::String, false),
            ],
            vec![0],
        )
        .unwrap();
        let rows = 40_000;
        let batch = RecordBatch::try_new(
            schema.arrow_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("{i:0100}")),
                )),
            ],
        )
        .unwrap();
        let path = dir.path().join("r.parquet");
        write_columns(&path, &schema, &[0, 1], &[batch]).unwrap();
        let metadata = load_metadata(&path, &File::open(&path).unwrap()).unwrap();
        let index = metadata.metadata().offset_index().expect("an offset index");
        let pages = |column: usize| -> Vec<i64> {
            let locations = index
                .iter()
                .flat_map(|group| group[column].page_locations());
            let starts: Vec<i64> = locations.map(|p| p.first_row_index).collect();
            let ends = starts.iter().skip(1).copied().chain([rows as i64]);
            ends.zip(&starts).map(|(end, start)| end - start).collect()
        };
        let widest = PAGE_BYTES + WRITE_BATCH_ROWS * 104;
        assert!(
            pages(1).iter().all(|&n| n as usize * 104 <= widest),
            "{:?}",
            pages(1)
        );
        assert!(pages(0).iter().all(|&n| n as usize <= PAGE_ROWS));
        assert!(pages(0).len() < pages(1).len());
        // Distinct bodies outgrow a dictionary: they are plain from the first page.
        for group in metadata.metadata().row_groups() {
            let body = group.column(1);
            assert!(body.dictionary_page_offset().is_none());
            assert!(!body.encodings().any(|e| e == Encoding::RLE_DICTIONARY));
        }
    }

    /// A plain column that LZ4 does not shrink is stored uncompressed, and reads back the same;
    /// one that shrinks, or whose compression is given, stays LZ4.
    #[test]
    fn values_lz4_does_not_shrink_are_stored_uncompressed() {
        use parquet::basic::Compression;
        use rand::RngCore;
        let dir = tempfile::tempdir().unwrap();
        let given = ColumnSchema {
            compression: ColumnCompression::Lz4,
            ..ColumnSchema::new("given", ColumnType::Binary, false)
        };
        let schema = Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("random", ColumnType::Binary, false),
                ColumnSchema::new("text", ColumnType::String, false),
                given,
            ],
            vec![0],
        )
        .unwrap();
        let rows = 20_000;
        let mut rng = rand::rng();
        let random: Vec<Vec<u8>> = (0..rows)
            .map(|_| {
                let mut v = vec![0u8; 100];
                rng.fill_bytes(&mut v);
                v
            })
            .collect();
        let batch = RecordBatch::try_new(
            schema.arrow_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(BinaryArray::from_iter_values(&random)),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("message number {i} of the queue")),
                )),
                Arc::new(BinaryArray::from_iter_values(&random)),
            ],
        )
        .unwrap();
        let path = dir.path().join("r.parquet");
        write_columns(&path, &schema, &[0, 1, 2, 3], &[batch.clone()]).unwrap();
        let metadata = load_metadata(&path, &File::open(&path).unwrap()).unwrap();
        for group in metadata.metadata().row_groups() {
            assert_eq!(group.column(1).compression(), Compression::UNCOMPRESSED);
            assert_eq!(group.column(2).compression(), Compression::LZ4_RAW);
            assert_eq!(group.column(3).compression(), Compression::LZ4_RAW);
        }
        let read = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let read = read.collect::<Result<Vec<_>, _>>().unwrap();
        let read = arrow::compute::concat_batches(&read[0].schema(), &read).unwrap();
        assert_eq!(read.columns(), batch.columns());
    }
}
