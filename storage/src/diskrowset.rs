//! DiskRowSets: immutable columnar files holding flushed rows in primary-key order.
//!
//! A DiskRowSet is one Parquet file (LZ4, dictionary encoding, page statistics) with the table's
//! columns plus `__key`, the encoded primary key of each row. The row ordinal in the file
//! identifies a row for its delta store. On open the key column is loaded into memory: key
//! lookups are a binary search, and the first/last key bound which lookups need this rowset at
//! all. (A sparse key index, bloom filters and per-column encodings are the storage issue's.)

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray, RecordBatch};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use arrow::error::ArrowError;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowFilter, RowSelection, RowSelector,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::file::metadata::{PageIndexPolicy, RowGroupMetaData};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::SchemaDescriptor;

use crate::scan::{predicate_mask, ColumnPredicate, PredicateOp, Scalar};
use crate::{Schema, StorageError};

pub const KEY_COLUMN: &str = "__key";

pub struct DiskRowSet {
    pub id: u64,
    path: PathBuf,
    /// Encoded keys, sorted; position = row ordinal.
    keys: Vec<Vec<u8>>,
    bytes: u64,
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
    /// synced to disk.
    pub fn write(
        dir: &Path,
        id: u64,
        table: &SchemaRef,
        batches: &[RecordBatch],
        keys: Vec<Vec<u8>>,
    ) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        let file = File::create(&path)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::LZ4_RAW)
            .set_dictionary_enabled(true)
            .set_statistics_enabled(EnabledStatistics::Page)
            .build();
        let schema = file_schema(table);
        let mut writer = ArrowWriter::try_new(&file, schema.clone(), Some(props))?;
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
        writer.close()?;
        file.sync_all()?;
        let bytes = file.metadata()?.len();
        Ok(DiskRowSet {
            id,
            path,
            keys,
            bytes,
        })
    }

    /// Opens rowset `id` in `dir`, loading its key column.
    pub fn open(dir: &Path, id: u64) -> Result<DiskRowSet, StorageError> {
        let path = dir.join(Self::file_name(id));
        let file = File::open(&path)?;
        let bytes = file.metadata()?.len();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
        let key_index = builder.schema().index_of(KEY_COLUMN).map_err(|_| {
            StorageError::Corruption(format!("{} has no key column", path.display()))
        })?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), [key_index]);
        let mut keys = Vec::new();
        for batch in builder.with_projection(mask).build()? {
            let batch = batch?;
            let column = batch.column(0).as_binary_opt::<i32>().ok_or_else(|| {
                StorageError::Corruption(format!("{}: key column is not binary", path.display()))
            })?;
            keys.extend(column.iter().map(|k| k.unwrap_or_default().to_vec()));
        }
        if keys.windows(2).any(|w| w[0] >= w[1]) {
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
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn num_rows(&self) -> usize {
        self.keys.len()
    }

    pub fn disk_bytes(&self) -> u64 {
        self.bytes
    }

    pub fn key(&self, ordinal: u32) -> &[u8] {
        &self.keys[ordinal as usize]
    }

    /// The ordinal of `key` in this rowset.
    pub fn find(&self, key: &[u8]) -> Option<u32> {
        match (self.keys.first(), self.keys.last()) {
            (Some(first), Some(last)) if first.as_slice() <= key && key <= last.as_slice() => self
                .keys
                .binary_search_by(|k| k.as_slice().cmp(key))
                .ok()
                .map(|i| i as u32),
            _ => None,
        }
    }

    /// A reader of the table columns `columns` (indexes into `schema`), in ordinal order,
    /// without the rows at `hidden` (sorted ordinals) and with `predicates` applied.
    ///
    /// Row groups whose min/max statistics exclude a predicate are skipped unread. The
    /// predicate columns are decoded and filtered first; the other columns are decoded only
    /// for the rows that pass (Parquet's late materialisation, skipping whole pages where
    /// none does). The file is opened now, so the reader keeps working if the rowset is later
    /// replaced.
    pub fn reader(
        &self,
        schema: &Schema,
        columns: &[usize],
        hidden: &[u32],
        predicates: &[ColumnPredicate],
        batch_size: usize,
    ) -> Result<ParquetRecordBatchReader, StorageError> {
        // The offset index lets the reader skip pages in which no row is selected.
        let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
        let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(
            File::open(&self.path)?,
            options,
        )?;
        let parquet_schema = builder.parquet_schema().clone();
        let mask = ProjectionMask::roots(&parquet_schema, columns.iter().copied());
        let mut skipped: Vec<(usize, usize)> = hidden.iter().map(|&o| (o as usize, 1)).collect();
        let mut start = 0;
        for group in builder.metadata().row_groups() {
            let rows = group.num_rows() as usize;
            if excluded_by_statistics(schema, builder.schema(), &parquet_schema, group, predicates)
                .unwrap_or(false)
            {
                skipped.push((start, rows));
            }
            start += rows;
        }
        let mut builder = builder
            .with_projection(mask)
            .with_batch_size(batch_size.max(1));
        if !skipped.is_empty() {
            builder = builder.with_row_selection(selection(skipped, start));
        }
        if !predicates.is_empty() {
            let mut predicate_columns: Vec<usize> = predicates.iter().map(|p| p.column).collect();
            predicate_columns.sort_unstable();
            predicate_columns.dedup();
            let schema = schema.clone();
            let predicates = predicates.to_vec();
            let filter = ArrowPredicateFn::new(
                ProjectionMask::roots(&parquet_schema, predicate_columns),
                move |batch| {
                    predicate_mask(&schema, &predicates, &batch)
                        .map_err(|e| ArrowError::ExternalError(Box::new(e)))
                },
            );
            builder = builder.with_row_filter(RowFilter::new(vec![Box::new(filter)]));
        }
        Ok(builder.build()?)
    }

    /// Reads the full rows at `ordinals` (sorted, distinct), all table columns.
    pub fn read_rows(
        &self,
        num_columns: usize,
        ordinals: &[u32],
    ) -> Result<RecordBatch, StorageError> {
        let mut selectors = Vec::new();
        let mut next = 0u32;
        for &o in ordinals {
            if o > next {
                selectors.push(RowSelector::skip((o - next) as usize));
            }
            selectors.push(RowSelector::select(1));
            next = o + 1;
        }
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&self.path)?)?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), 0..num_columns);
        let reader = builder
            .with_projection(mask)
            .with_row_selection(RowSelection::from(selectors))
            .with_batch_size(ordinals.len().max(1))
            .build()?;
        let schema = arrow::array::RecordBatchReader::schema(&reader);
        let batches = reader.collect::<Result<Vec<_>, _>>()?;
        Ok(arrow::compute::concat_batches(&schema, &batches)?)
    }
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
            PredicateOp::IsNull | PredicateOp::IsNotNull | PredicateOp::Bloom(_) => false,
        };
        if excluded {
            return Ok(true);
        }
    }
    Ok(false)
}
