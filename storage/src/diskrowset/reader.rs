//! Scans of a rowset's base data: the rows a scan reads, with hidden ordinals (rows whose
//! deltas change them at the snapshot) skipped and predicates applied.
//!
//! As little as possible is decoded: key predicates narrow the ordinal range through the key
//! index (and a join filter's few keys, looked up there, narrow it to their rows), row-group
//! statistics skip whole row groups, and (when no column file is involved)
//! predicate columns are decoded before the others so that pages no row passes are skipped
//! (late materialisation). Readers open their files when created, so a scan is unaffected by
//! the rowset being replaced while it runs.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{DataType, Schema as ArrowSchema, SchemaRef};
use arrow::error::ArrowError;
use bytes::Bytes;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowFilter, RowSelection, RowSelector,
};
use parquet::arrow::push_decoder::{ParquetPushDecoder, ParquetPushDecoderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::RowGroupMetaData;
use parquet::schema::types::{SchemaDescPtr, SchemaDescriptor};
use parquet::DecodeResult;

use super::{guard, DiskRowSet};
use crate::column_map::ColumnMap;
use crate::scan::{predicate_mask, ColumnPredicate, PredicateOp};
use crate::{ColumnType, Scalar, Schema, StorageError};

impl DiskRowSet {
    /// A reader of the table columns `columns` (indexes into `schema`, the predicates'
    /// columns among them) of the rows `rows`, in ordinal order, with `predicates` applied;
    /// string columns decoded as `Utf8View` if `string_views` (values are then not copied out
    /// of the pages).
    ///
    /// Row groups whose min/max statistics exclude a predicate are skipped unread. When all
    /// the columns are in the rowset's own file, the predicate columns are decoded and
    /// filtered first and the other columns only for the rows that pass (Parquet's late
    /// materialisation, skipping whole pages where none does). The files are opened now, so
    /// the reader keeps working if the rowset is later replaced.
    ///
    /// A rowset written under an older schema is read in its own columns and its batches
    /// returned as the table's (see [`crate::column_map`]).
    pub(crate) fn reader(
        &self,
        schema: &Schema,
        columns: &[usize],
        rows: RowsRead,
        predicates: &[ColumnPredicate],
        batch_size: usize,
        string_views: bool,
    ) -> Result<RowsetReader, StorageError> {
        let Some(written) = self.written() else {
            return self.file_reader(schema, columns, rows, predicates, batch_size, string_views);
        };
        let map = &written.map;
        let Some(predicates) = map.file_predicates(predicates)? else {
            return Ok(RowsetReader::Empty);
        };
        let mut file_columns = map.file_columns(columns);
        if file_columns.is_empty() {
            // Only columns added since: the rows' count comes from a key column.
            file_columns.push(written.schema.key_columns()[0]);
        }
        let inner = self.file_reader(
            &written.schema,
            &file_columns,
            rows,
            &predicates,
            batch_size,
            string_views,
        )?;
        Ok(RowsetReader::Mapped {
            inner: Box::new(inner),
            map: map.clone(),
            columns: columns.to_vec(),
            views: string_views,
        })
    }

    /// [`Self::reader`] of the files' columns `columns` (indexes into `schema`, the files'
    /// own).
    fn file_reader(
        &self,
        schema: &Schema,
        columns: &[usize],
        rows: RowsRead,
        predicates: &[ColumnPredicate],
        batch_size: usize,
        string_views: bool,
    ) -> Result<RowsetReader, StorageError> {
        if columns.iter().any(|&c| self.source(c).0.is_some()) {
            return self
                .zip_reader(schema, columns, rows, predicates, batch_size)
                .map(RowsetReader::Zip);
        }
        let file = File::open(&self.path)?;
        let metadata = self.metadata.clone();
        let parquet_schema = metadata.parquet_schema().clone();
        let hidden = rows.hidden;
        // Without predicates every row is decoded in order, so hidden rows are cheaper to drop
        // from the decoded batches than to skip one by one in the decoder.
        let drop_after = predicates.is_empty() && !hidden.is_empty() && rows.within.is_none();
        let mut skipped: Vec<(usize, usize)> = match drop_after {
            true => Vec::new(),
            false => hidden.iter().map(|&o| (o as usize, 1)).collect(),
        };
        skipped.extend(self.outside_key_range(schema, predicates));
        skipped.extend(rows.outside_within(self.num_rows()));
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
        let group_rows = read_groups.iter().map(|g| g.num_rows() as usize).collect();
        let dictionaries = dictionary_columns(schema, &predicates);
        let decoded = match dictionaries.is_empty() && !string_views {
            true => None,
            false => decoded_as(&metadata, &dictionaries, string_views),
        };
        let mut builder =
            ParquetPushDecoderBuilder::new_with_metadata(decoded.clone().unwrap_or(metadata))
                .with_projection(ProjectionMask::roots(
                    &parquet_schema,
                    columns.iter().copied(),
                ))
                .with_batch_size(batch_size.max(1));
        if !skipped.is_empty() {
            builder = builder.with_row_selection(selection(skipped, start));
        }
        let mut predicate_columns: Vec<usize> = predicates.iter().map(|p| p.column).collect();
        predicate_columns.sort_unstable();
        predicate_columns.dedup();
        let mut reader = FileReader {
            late: false,
            more_columns: columns.iter().any(|c| !predicate_columns.contains(c)),
            predicate_columns,
            group_rows,
            tested: 0,
            passed: 0,
            dictionaries: decoded.is_some(),
            string_views,
            path: self.path.clone(),
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
        rows: RowsRead,
        predicates: &[ColumnPredicate],
        batch_size: usize,
    ) -> Result<ZipReader, StorageError> {
        let mut skipped: Vec<(usize, usize)> =
            rows.hidden.iter().map(|&o| (o as usize, 1)).collect();
        skipped.extend(self.outside_key_range(schema, predicates));
        skipped.extend(rows.outside_within(self.num_rows()));
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
                path: file.path.to_path_buf(),
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

    /// The ordinals `[first, end)` outside which no row can pass `predicates`, searched in the
    /// key index: from `=`, `<`, `<=`, `>`, `>=` on the first key column where its encoding
    /// orders keys on its own (fixed-width types, or a one-column key), and from the range of
    /// keys of [`scan::key_range`](crate::scan::key_range) (`=` on leading key columns: one
    /// queue of a queue table).
    fn key_range(&self, schema: &Schema, predicates: &[ColumnPredicate]) -> (usize, usize) {
        let n = self.num_rows();
        // Page-exact bounds, as below.
        let range = crate::scan::key_range(schema, predicates);
        let (first, end) = match range == crate::scan::KeyRange::default() {
            true => (0, n),
            false => (
                self.keys.lower_bound(|k| k < &range.lower[..]),
                (range.upper.as_ref()).map_or(n, |upper| self.keys.upper_bound(|k| k < &upper[..])),
            ),
        };
        let first_column = schema.key_columns()[0];
        let column_type = &schema.columns()[first_column].column_type;
        let whole_key = schema.key_columns().len() == 1;
        let variable = matches!(
            column_type,
            ColumnType::String | ColumnType::Varchar { .. } | ColumnType::Binary
        );
        if variable && !whole_key {
            return (first.min(end), end);
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
        let (mut first, mut end) = (first, end);
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
}

/// The rows of a rowset that a scan reads: all but the `hidden` ordinals (sorted: rows whose
/// deltas change them at the snapshot), and, when `within` is set, only those in its (start,
/// length) ranges (ascending, possibly overlapping).
#[derive(Clone, Copy)]
pub(crate) struct RowsRead<'a> {
    pub hidden: &'a [u32],
    pub within: Option<&'a [(usize, usize)]>,
}

impl RowsRead<'_> {
    /// The (start, length) ranges of `total` rows outside `within`.
    fn outside_within(&self, total: usize) -> Vec<(usize, usize)> {
        self.within
            .map_or_else(Vec::new, |within| gaps(within, total))
    }
}

/// The (start, length) ranges of `total` rows outside `ranges` (ascending by start, possibly
/// overlapping).
pub(super) fn gaps(ranges: &[(usize, usize)], total: usize) -> Vec<(usize, usize)> {
    let mut outside = Vec::new();
    let mut next = 0;
    for &(start, len) in ranges {
        if start > next {
            outside.push((next, start - next));
        }
        next = next.max(start.saturating_add(len));
    }
    if next < total {
        outside.push((next, total - next));
    }
    outside
}

/// A selection of `total` rows without the `skipped` (start, length) ranges (in any order,
/// possibly overlapping, possibly beyond `total`: the ordinals of a damaged delta file).
fn selection(mut skipped: Vec<(usize, usize)>, total: usize) -> RowSelection {
    skipped.sort_unstable();
    let mut selectors = Vec::new();
    let mut next = 0;
    for (start, len) in skipped {
        let end = start.saturating_add(len).min(total);
        let start = start.max(next);
        if end <= start {
            continue;
        }
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
        let s = |v: &Scalar| v.datum_of(min.data_type());
        let all = |b: BooleanArray| b.null_count() == 0 && b.true_count() == b.len();
        let excluded = match &p.op {
            PredicateOp::Eq(v) => all(cmp::gt(&min, &s(v)?)?) || all(cmp::lt(&max, &s(v)?)?),
            PredicateOp::Lt(v) => all(cmp::gt_eq(&min, &s(v)?)?),
            PredicateOp::LtEq(v) => all(cmp::gt(&min, &s(v)?)?),
            PredicateOp::Gt(v) => all(cmp::lt_eq(&max, &s(v)?)?),
            PredicateOp::GtEq(v) => all(cmp::lt(&max, &s(v)?)?),
            PredicateOp::InList(values) => {
                let mut outside = true;
                for v in values {
                    outside &= all(cmp::gt(&min, &s(v)?)?) || all(cmp::lt(&max, &s(v)?)?);
                }
                outside
            }
            PredicateOp::JoinFilter { filter, .. } => match filter.bounds() {
                Some((low, high)) => {
                    all(cmp::lt(&max, &s(low)?)?) || all(cmp::gt(&min, &s(high)?)?)
                }
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
    let all = |b: BooleanArray| b.null_count() == 0 && b.true_count() == b.len();
    Ok(nulls.values().iter().all(|&n| n == 0)
        && all(cmp::gt_eq(&min, &low.datum_of(min.data_type())?)?)
        && all(cmp::lt_eq(&max, &high.datum_of(max.data_type())?)?))
}

/// Reads a rowset's base data for a scan (see [`DiskRowSet::reader`]).
pub(crate) enum RowsetReader {
    File(Box<FileReader>),
    Zip(ZipReader),
    /// A rowset written under an older schema: its batches as the table's columns `columns`.
    Mapped {
        inner: Box<RowsetReader>,
        map: Arc<ColumnMap>,
        columns: Vec<usize>,
        views: bool,
    },
    /// No row can pass the predicates.
    Empty,
}

impl Iterator for RowsetReader {
    type Item = Result<RecordBatch, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            RowsetReader::File(r) => r.next(),
            RowsetReader::Zip(r) => r.next(),
            RowsetReader::Mapped {
                inner,
                map,
                columns,
                views,
            } => Some(
                inner
                    .next()?
                    .and_then(|b| map.to_table(&b, columns, *views)),
            ),
            RowsetReader::Empty => None,
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
    path: PathBuf,
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
                let reader = &mut part.reader;
                part.pending = guard(&part.path, || Ok(reader.next().transpose()?))?;
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
/// predicates that stopped paying (join filters that switched themselves off) and choose how
/// the predicates run for the next row group, from how many rows passed them in the last one:
/// - after decoding (every column of every row decoded, then filtered): cheapest when most
///   rows pass, or when the scan reads no column but the predicates' own;
/// - as a Parquet row filter (late materialisation): the predicates' columns are decoded
///   first, the other columns only for the rows and pages that pass. That pays when few pass,
///   but a scattered selection slows the decoding of the others, so the row filter is used only
///   while at most [`LATE_BELOW`] of the rows pass.
///
/// The first row group is filtered after decoding, which measures the predicates.
pub(crate) struct FileReader {
    path: PathBuf,
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
    /// Whether string columns may be decoded as dictionaries (to be cast back).
    dictionaries: bool,
    /// Whether string columns are returned as `Utf8View`.
    string_views: bool,
    /// Whether the predicates run as a row filter (else after decoding).
    late: bool,
    /// Whether the scan reads columns that no predicate reads.
    more_columns: bool,
    predicate_columns: Vec<usize>,
    /// The rows of each row group still to be read, in order.
    group_rows: std::collections::VecDeque<usize>,
    /// Rows the predicates tested and passed in the current row group.
    tested: usize,
    passed: usize,
}

/// Predicates run as a row filter while at most this share of the rows pass them.
const LATE_BELOW: f64 = 0.25;

/// String columns that predicates test (but for join filters, which hash values): decoded as
/// dictionaries, a predicate compares each distinct value once instead of every row's, and
/// only the rows that pass are turned into strings.
fn dictionary_columns(schema: &Schema, predicates: &[ColumnPredicate]) -> Vec<usize> {
    let mut columns: Vec<usize> = predicates
        .iter()
        .map(|p| p.column)
        .filter(|&c| {
            schema.columns()[c].column_type == ColumnType::String
                && predicates
                    .iter()
                    .all(|p| p.column != c || !p.op.is_join_filter())
        })
        .collect();
    columns.sort_unstable();
    columns.dedup();
    columns
}

/// `metadata` with the string columns `dictionaries` (positions in the file) read as
/// dictionaries and, if `views`, the other string columns as `Utf8View`; None if the reader
/// cannot be told so.
fn decoded_as(
    metadata: &ArrowReaderMetadata,
    dictionaries: &[usize],
    views: bool,
) -> Option<ArrowReaderMetadata> {
    let arrow = metadata.schema();
    let fields: Vec<arrow::datatypes::Field> = (arrow.fields().iter().enumerate())
        .map(|(i, f)| match f.data_type() {
            DataType::Utf8 if dictionaries.contains(&i) => f.as_ref().clone().with_data_type(
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            ),
            DataType::Utf8 if views => f.as_ref().clone().with_data_type(DataType::Utf8View),
            _ => f.as_ref().clone(),
        })
        .collect();
    let schema = Arc::new(ArrowSchema::new_with_metadata(
        fields,
        arrow.metadata().clone(),
    ));
    let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new().with_schema(schema);
    ArrowReaderMetadata::try_new(metadata.metadata().clone(), options).ok()
}

/// `batch` with its dictionary columns cast back to their values' type (as `Utf8View` if
/// `views`).
fn without_dictionaries(batch: RecordBatch, views: bool) -> Result<RecordBatch, StorageError> {
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Dictionary(..)))
    {
        return Ok(batch);
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        match field.data_type() {
            DataType::Dictionary(_, values) => {
                let values = match (views, values.as_ref()) {
                    (true, DataType::Utf8) => DataType::Utf8View,
                    (_, values) => values.clone(),
                };
                columns.push(arrow::compute::cast(column, &values)?);
                fields.push(field.as_ref().clone().with_data_type(values));
            }
            _ => {
                columns.push(column.clone());
                fields.push(field.as_ref().clone());
            }
        }
    }
    let schema = Arc::new(ArrowSchema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ));
    Ok(RecordBatch::try_new_with_options(
        schema,
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

impl FileReader {
    /// `batch` as decoded, filtered by the predicates unless a row filter did; counts the rows
    /// tested and passed.
    fn filter(&mut self, batch: RecordBatch) -> Result<RecordBatch, StorageError> {
        if self.predicates.is_empty() {
            return Ok(batch);
        }
        if self.late {
            self.passed += batch.num_rows();
            return Ok(batch);
        }
        let mask = predicate_mask(&self.schema, &self.predicates, &batch)?;
        self.tested += batch.num_rows();
        self.passed += mask.true_count();
        Ok(arrow::compute::filter_record_batch(&batch, &mask)?)
    }

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
        if self.predicates.is_empty() || !self.late {
            return builder.with_row_filter(RowFilter::new(vec![]));
        }
        let schema = self.schema.clone();
        let predicates = self.predicates.clone();
        let filter = ArrowPredicateFn::new(
            ProjectionMask::roots(&self.parquet_schema, self.predicate_columns.iter().copied()),
            move |batch| {
                predicate_mask(&schema, &predicates, &batch)
                    .map_err(|e| ArrowError::ExternalError(Box::new(e)))
            },
        );
        builder.with_row_filter(RowFilter::new(vec![Box::new(filter)]))
    }

    /// Between row groups: rebuilds the decoder without bloom filters that switched off, or
    /// to run the predicates the other way (see [`FileReader`]).
    fn adapt(&mut self) -> Result<(), StorageError> {
        let switched_off = |p: &ColumnPredicate| matches!(&p.op, PredicateOp::JoinFilter { filter, .. } if filter.stats.disabled());
        let Some(decoder) = self
            .decoder
            .take_if(|d| d.is_at_row_group_boundary() && d.row_groups_remaining() > 0)
        else {
            return Ok(());
        };
        let late = match self.tested {
            0 => self.late,
            tested => self.more_columns && (self.passed as f64) <= LATE_BELOW * tested as f64,
        };
        (self.tested, self.passed) = (0, 0);
        if !self.predicates.iter().any(switched_off) && late == self.late {
            self.decoder = Some(decoder);
            return Ok(());
        }
        self.late = late;
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
                    // The ranges come from the footer: beyond the file, it is damaged (and a
                    // buffer of that size must not be allocated).
                    let len = self.file.metadata()?.len();
                    if ranges.iter().any(|r| r.start > r.end || r.end > len) {
                        return Err(StorageError::Corruption(format!(
                            "{}: the footer points past the end of the file",
                            self.path.display()
                        )));
                    }
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
                    // Measured in rows of the group under a row filter (the rows selected
                    // ahead of it, which the key range and hidden rows leave, are not known
                    // here), in rows decoded after.
                    let rows = self.group_rows.pop_front().unwrap_or(0);
                    if self.late {
                        self.tested += rows;
                    }
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
        let path = self.path.clone();
        guard(&path, || Ok(self.next_unguarded())).unwrap_or_else(|e| {
            self.decoder = None;
            self.current = None;
            Some(Err(e))
        })
    }
}

impl FileReader {
    /// [`Iterator::next`], where the Parquet decoder may panic (see [`guard`]).
    fn next_unguarded(&mut self) -> Option<Result<RecordBatch, StorageError>> {
        loop {
            if let Some(batch) = self.current.as_mut().and_then(Iterator::next) {
                let batch = batch
                    .map_err(StorageError::from)
                    .and_then(|b| self.filter(b));
                if batch.as_ref().is_ok_and(|b| b.num_rows() == 0) {
                    continue;
                }
                return Some(
                    match self.dictionaries {
                        true => batch.and_then(|b| without_dictionaries(b, self.string_views)),
                        false => batch,
                    }
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
