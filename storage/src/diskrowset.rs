//! DiskRowSets: immutable columnar files holding flushed rows in primary-key order.
//!
//! A DiskRowSet is one Parquet file (page statistics; per column the encoding and compression of
//! its schema, by default dictionary encoding and LZ4) with the table's columns plus `__key`, the encoded primary key of each row. The row ordinal in the file
//! identifies a row for its delta store. On open the key column is loaded into memory: key
//! lookups are a binary search, and the first/last key bound which lookups need this rowset at
//! all. (A sparse key index and bloom filters are the storage issue's.)

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray, RecordBatch};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
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
use std::os::unix::fs::FileExt;

pub(crate) use crate::bloom::hash_bytes;
use crate::bloom::SplitBlockFilter;
use crate::checksum::ChecksumWriter;
use crate::scan::{predicate_mask, ColumnPredicate, PredicateOp, Scalar};
use crate::{ColumnCompression, ColumnEncoding, ColumnType, Schema, StorageError};

pub const KEY_COLUMN: &str = "__key";
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
    /// Encoded keys, sorted; position = row ordinal.
    keys: KeyIndex,
    bytes: u64,
    /// The file's footer and page index, read once.
    metadata: ArrowReaderMetadata,
    /// CRC32 of the file (None for files written before checksums were recorded).
    pub checksum: Option<u32>,
}

pub(crate) fn load_metadata(file: &File) -> Result<ArrowReaderMetadata, StorageError> {
    // The offset index lets the decoder skip pages in which no row is selected.
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    Ok(ArrowReaderMetadata::load(file, options)?)
}

/// A rowset's encoded keys in order, packed into one buffer with the end offset of each (about
/// 12 bytes per BIGINT key instead of a heap allocation per key), and a split-block bloom filter
/// over them, so most lookups of a key the rowset does not hold stop at one cache line.
struct KeyIndex {
    bytes: Vec<u8>,
    ends: Vec<u32>,
    bloom: SplitBlockFilter,
}

impl KeyIndex {
    fn new<'a>(keys: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<Self, StorageError> {
        let mut index = KeyIndex {
            bytes: Vec::new(),
            ends: Vec::with_capacity(keys.len()),
            bloom: SplitBlockFilter::with_keys(keys.len()),
        };
        for key in keys {
            index.bytes.extend_from_slice(key);
            let end = u32::try_from(index.bytes.len()).map_err(|_| {
                StorageError::Corruption("the keys of one rowset exceed 4 GiB".into())
            })?;
            index.ends.push(end);
            index.bloom.insert(hash_bytes(key));
        }
        index.bytes.shrink_to_fit();
        Ok(index)
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, i: usize) -> &[u8] {
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        &self.bytes[start..self.ends[i] as usize]
    }

    /// The number of leading keys for which `before` holds (keys are sorted, `before` monotone).
    fn partition_point(&self, before: impl Fn(&[u8]) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len());
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

    fn is_sorted(&self) -> bool {
        (1..self.len()).all(|i| self.get(i - 1) < self.get(i))
    }

    /// The position of `key` (whose [`hash_bytes`] is `hash`).
    fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        let n = self.len();
        if n == 0 || key < self.get(0) || key > self.get(n - 1) || !self.bloom.check(hash) {
            return None;
        }
        let (mut low, mut high) = (0, n);
        while low < high {
            let mid = (low + high) / 2;
            match self.get(mid).cmp(key) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    fn memory_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * 4 + self.bloom.bytes()
    }
}

fn file_schema(table: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Field> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(KEY_COLUMN, DataType::Binary, false));
    Arc::new(ArrowSchema::new(fields))
}

impl DiskRowSet {
    pub fn file_name(id: u64) -> String {
        format!("rowset-{id:010}.parquet")
    }

    /// Writes `batches` (table columns, key order) with their `keys` as rowset `id` in `dir`,
    /// synced to disk, each column with its encoding and compression.
    pub fn write(
        dir: &Path,
        id: u64,
        table: &Schema,
        batches: &[RecordBatch],
        keys: Vec<Vec<u8>>,
    ) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        let file = ChecksumWriter::create(&path)?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::LZ4_RAW)
            .set_dictionary_enabled(true)
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            // Small pages: a key lookup decodes one page per column, found by the offset index.
            .set_data_page_row_count_limit(PAGE_ROWS)
            .set_dictionary_page_size_limit(DICTIONARY_BYTES);
        for column in table.columns() {
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
        // Keys are unique: a dictionary would only cost (and every lookup would decode it).
        let props = props
            .set_column_dictionary_enabled(ColumnPath::from(KEY_COLUMN), false)
            .build();
        let schema = file_schema(&table.arrow_schema());
        let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
        let mut offset = 0;
        for batch in batches {
            let n = batch.num_rows();
            let key_array: ArrayRef = Arc::new(BinaryArray::from_iter_values(
                keys[offset..offset + n].iter(),
            ));
            offset += n;
            let mut columns = batch.columns().to_vec();
            columns.push(key_array);
            writer.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
        }
        let checksum = writer.into_inner()?.finish()?;
        let file = File::open(&path)?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&file)?;
        Ok(DiskRowSet {
            id,
            path,
            keys: KeyIndex::new(keys.iter().map(Vec::as_slice))?,
            bytes,
            metadata,
            checksum: Some(checksum),
        })
    }

    /// Opens rowset `id` in `dir`, checking it against `checksum` (when the metadata has
    /// one) and loading its key column.
    pub fn open(dir: &Path, id: u64, checksum: Option<u32>) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        if let Some(expected) = checksum {
            crate::checksum::verify(&path, expected)?;
        }
        let file = File::open(&path)?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&file)?;
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata.clone());
        let key_index = builder.schema().index_of(KEY_COLUMN).map_err(|_| {
            StorageError::Corruption(format!("{} has no key column", path.display()))
        })?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), [key_index]);
        let mut batches = Vec::new();
        for batch in builder.with_projection(mask).build()? {
            let batch = batch?;
            let column = batch.column(0).as_binary_opt::<i32>().ok_or_else(|| {
                StorageError::Corruption(format!("{}: key column is not binary", path.display()))
            })?;
            if column.null_count() > 0 {
                return Err(StorageError::Corruption(format!(
                    "{}: a key is missing",
                    path.display()
                )));
            }
            batches.push(column.clone());
        }
        let rows: usize = batches.iter().map(|b| b.len()).sum();
        let keys = KeyIndex::new(ExactLen(
            batches.iter().flat_map(|b| b.iter().flatten()),
            rows,
        ))?;
        if !keys.is_sorted() {
            return Err(StorageError::Corruption(format!(
                "{}: keys out of order",
                path.display()
            )));
        }
        Ok(DiskRowSet {
            id,
            path,
            keys,
            bytes,
            metadata,
            checksum,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn num_rows(&self) -> usize {
        self.keys.len()
    }

    /// Memory held for key lookups.
    pub fn key_index_bytes(&self) -> usize {
        self.keys.memory_bytes()
    }

    pub fn disk_bytes(&self) -> u64 {
        self.bytes
    }

    pub fn key(&self, ordinal: u32) -> &[u8] {
        self.keys.get(ordinal as usize)
    }

    /// The ordinal of `key` in this rowset; `hash` is its [`hash_bytes`], computed once for all
    /// the rowsets a lookup tries.
    pub fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        self.keys.find(key, hash).map(|i| i as u32)
    }

    /// A reader of the table columns `columns` (indexes into `schema`), in ordinal order,
    /// without the rows at `hidden` (sorted ordinals) and with `predicates` applied.
    ///
    /// Row groups whose min/max statistics exclude a predicate are skipped unread. The
    /// predicate columns are decoded and filtered first; the other columns are decoded only
    /// for the rows that pass (Parquet's late materialisation, skipping whole pages where
    /// none does). The file is opened now, so the reader keeps working if the rowset is later
    /// replaced.
    /// A reader of the base rows of this rowset for a scan: `columns` only, rows at the
    /// `hidden` ordinals and row groups that the predicates exclude by their statistics
    /// skipped, predicates applied before other columns are decoded.
    pub(crate) fn reader(
        &self,
        schema: &Schema,
        columns: &[usize],
        hidden: &[u32],
        predicates: &[ColumnPredicate],
        batch_size: usize,
    ) -> Result<RowsetReader, StorageError> {
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
        // Rows outside the ordinal range that key predicates allow are not read at all.
        let (first, end) = self.key_range(schema, predicates);
        skipped.extend(
            [(0, first), (end, self.num_rows() - end)]
                .into_iter()
                .filter(|r| r.1 > 0),
        );
        let mut read_groups = Vec::new();
        let mut start = 0;
        for group in metadata.metadata().row_groups() {
            let rows = group.num_rows() as usize;
            if excluded_by_statistics(
                schema,
                metadata.schema(),
                &parquet_schema,
                group,
                predicates,
            )
            .unwrap_or(false)
            {
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
        let mut reader = RowsetReader {
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
        Ok(reader)
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
        let below = |bound: &[u8]| self.keys.partition_point(|k| compare(k, bound).is_lt());
        let not_above = |bound: &[u8]| self.keys.partition_point(|k| compare(k, bound).is_le());
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
                first = first.max(below(&low));
            }
            if let Some(high) = high {
                end = end.min(high);
            }
        }
        (first.min(end), end)
    }

    /// Reads the full rows at `ordinals` (sorted, distinct), all table columns.
    pub fn read_rows(
        &self,
        num_columns: usize,
        ordinals: &[u32],
    ) -> Result<RecordBatch, StorageError> {
        read_positions(&self.path, &self.metadata, num_columns, ordinals)
    }
}

/// Reads the first `num_columns` columns of the rows at `positions` (sorted, distinct) of a
/// Parquet file. Only the row groups holding them are read.
pub(crate) fn read_positions(
    path: &Path,
    metadata: &ArrowReaderMetadata,
    num_columns: usize,
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
                selectors.push(RowSelector::select(1));
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
    let mask = ProjectionMask::roots(builder.parquet_schema(), 0..num_columns);
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

/// Whether a row group's min/max statistics prove that no row passes `predicates`.
fn excluded_by_statistics(
    schema: &Schema,
    arrow_schema: &ArrowSchema,
    parquet_schema: &SchemaDescriptor,
    group: &RowGroupMetaData,
    predicates: &[ColumnPredicate],
) -> Result<bool, StorageError> {
    for p in predicates {
        let name = &schema.columns()[p.column].name;
        let converter = StatisticsConverter::try_new(name, arrow_schema, parquet_schema)?;
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

/// Decodes a rowset for a scan one row group at a time, so that between row groups it can drop
/// predicates that stopped paying (join filters that switched themselves off). Predicates run
/// as a Parquet row filter: their columns are decoded first (and kept for the output), the other
/// columns only for the rows and pages that pass.
pub(crate) struct RowsetReader {
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

impl RowsetReader {
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

impl Iterator for RowsetReader {
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
