//! Delta files: immutable files of a rowset's version records (UNDO or REDO), one file per
//! flush or compaction that wrote them.
//!
//! A delta file is a Parquet file: the table's columns it holds (nullable), then `__ordinal`,
//! `__ts` and `__deleted`, sorted by (ordinal, ts): a row's records are together and in time
//! order, so its oldest or newest record is found in one pass over the file. The metadata's
//! record count and checksum let the tablet check a file on open, and its timestamp range lets a
//! snapshot skip files it cannot need without reading them.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array, UInt64Array,
};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef, UInt32Type, UInt64Type};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use serde::{Deserialize, Serialize};

use crate::checksum::ChecksumWriter;
use crate::column_map::{default_column, ColumnMap};
use crate::diskrowset::{check_columns, guard, load_metadata, read_positions};
use crate::{Schema, StorageError, Timestamp};

const ORDINAL: &str = "__ordinal";
const TS: &str = "__ts";
const DELETED: &str = "__deleted";

/// What the tablet metadata records of a delta file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeltaMeta {
    pub id: u64,
    pub records: u64,
    pub min_ts: Timestamp,
    pub max_ts: Timestamp,
    /// CRC32 of the file.
    #[serde(default)]
    pub checksum: Option<u32>,
    /// The table columns (positions) whose values the file stores; None = all. A file with
    /// some columns holds per-column records: the other columns are those of the next newer
    /// version (for UNDO records, written by a major delta compaction that rewrote only them).
    #[serde(default)]
    pub columns: Option<Vec<u32>>,
    /// The table columns that records may change relative to the version before; None = any.
    /// A major delta compaction rewrites only these.
    #[serde(default)]
    pub changed: Option<Vec<u32>>,
    /// The ids of the columns whose positions `columns`, `changed` and the file's images
    /// refer to, when it was written under an older schema than the table's (None: the
    /// table's columns). See [`crate::column_map`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column_ids: Option<Vec<u32>>,
}

/// What a delta file holds: see [`DeltaMeta::columns`] and [`DeltaMeta::changed`].
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub columns: Option<Vec<u32>>,
    pub changed: Option<Vec<u32>>,
}

/// One version record to write: `image` is (source batch, row), or None for "absent".
#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub ordinal: u32,
    pub ts: Timestamp,
    pub image: Option<(usize, usize)>,
}

/// An immutable file of version records of one rowset.
pub struct DeltaFile {
    pub meta: DeltaMeta,
    path: PathBuf,
    bytes: u64,
    metadata: ArrowReaderMetadata,
    /// How the file's columns map onto the table's, when it was written under an older
    /// schema; with [`DeltaMeta::changed`] as table columns.
    map: Option<(Arc<ColumnMap>, Option<Vec<u32>>)>,
}

/// Records read from a delta file, in file order.
pub struct Records {
    pub ordinals: Vec<u32>,
    pub ts: Vec<u64>,
    pub deleted: BooleanArray,
    /// The table columns asked for, one row per record (NULLs for deletions).
    pub images: RecordBatch,
}

/// The file schema for the table columns `columns` (None = all).
fn file_schema(table: &SchemaRef, columns: Option<&[u32]>) -> SchemaRef {
    let mut fields: Vec<Field> = table
        .fields()
        .iter()
        .enumerate()
        .filter(|(c, _)| columns.is_none_or(|cs| cs.contains(&(*c as u32))))
        .map(|(_, f)| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(Field::new(ORDINAL, DataType::UInt32, false));
    fields.push(Field::new(TS, DataType::UInt64, false));
    fields.push(Field::new(DELETED, DataType::Boolean, false));
    Arc::new(ArrowSchema::new(fields))
}

impl DeltaFile {
    pub fn file_name(id: u64) -> String {
        format!("delta-{id:010}.parquet")
    }

    /// Writes `records` (sorted by ordinal, then ts) as delta file `id`, taking images from
    /// `sources` (batches with the table columns `layout.columns`, in order), synced to disk.
    pub fn write(
        dir: &Path,
        id: u64,
        table: &Schema,
        layout: Layout,
        sources: &[&RecordBatch],
        records: &[Record],
    ) -> Result<DeltaFile, StorageError> {
        let schema = file_schema(&table.arrow_schema(), layout.columns.as_deref());
        let stored = &schema.fields()[..schema.fields().len() - 3];
        let path = dir.join(Self::file_name(id));
        let file = ChecksumWriter::create(&path)?;
        // Ordinals ascend and timestamps cluster: delta encoding stores them in a few bits.
        let mut props = WriterProperties::builder()
            .set_compression(Compression::LZ4_RAW)
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(64 * 1024));
        for name in [ORDINAL, TS] {
            props = props
                .set_column_dictionary_enabled(ColumnPath::from(name), false)
                .set_column_encoding(ColumnPath::from(name), Encoding::DELTA_BINARY_PACKED);
        }
        let props = props.build();
        let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
        // Deletions take their (NULL) image from one extra all-NULL row.
        let nulls: Vec<ArrayRef> = stored
            .iter()
            .map(|f| new_null_array(f.data_type(), 1))
            .collect();
        for chunk in records.chunks(64 * 1024) {
            let indices: Vec<(usize, usize)> = chunk
                .iter()
                .map(|r| r.image.unwrap_or((sources.len(), 0)))
                .collect();
            let mut columns = Vec::with_capacity(schema.fields().len());
            // A flush's UNDO records of inserted rows are all "absent before": no image to
            // gather.
            let absent_only = chunk.iter().all(|r| r.image.is_none());
            for (c, null) in nulls.iter().enumerate() {
                if absent_only {
                    columns.push(new_null_array(null.data_type(), chunk.len()));
                    continue;
                }
                let mut arrays: Vec<&dyn Array> =
                    sources.iter().map(|b| b.column(c).as_ref()).collect();
                arrays.push(null.as_ref());
                columns.push(interleave(&arrays, &indices)?);
            }
            columns.push(Arc::new(UInt32Array::from_iter_values(
                chunk.iter().map(|r| r.ordinal),
            )));
            columns.push(Arc::new(UInt64Array::from_iter_values(
                chunk.iter().map(|r| r.ts.0),
            )));
            columns.push(Arc::new(BooleanArray::from_iter(
                chunk.iter().map(|r| Some(r.image.is_none())),
            )));
            writer.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
        }
        let checksum = writer.into_inner()?.finish()?;
        let meta = DeltaMeta {
            checksum: Some(checksum),
            columns: layout.columns,
            changed: layout.changed,
            column_ids: None,
            id,
            records: records.len() as u64,
            min_ts: records.iter().map(|r| r.ts).min().unwrap_or(Timestamp(0)),
            max_ts: records.iter().map(|r| r.ts).max().unwrap_or(Timestamp(0)),
        };
        Self::open(dir, meta, &Arc::new(table.clone()))
    }

    /// Opens the delta file `meta` describes, of a table with schema `table`, checking its
    /// checksum and that it holds the columns `meta` says (ascending table columns).
    pub fn open(
        dir: &Path,
        meta: DeltaMeta,
        table: &Arc<Schema>,
    ) -> Result<DeltaFile, StorageError> {
        let path = dir.join(Self::file_name(meta.id));
        if let Some(expected) = meta.checksum {
            crate::checksum::verify(&path, expected)?;
        }
        let file = File::open(&path).map_err(StorageError::on(&path))?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&path, &file)?;
        let map = meta
            .column_ids
            .as_deref()
            .and_then(|ids| ColumnMap::by_ids(ids, table));
        let width = map
            .as_ref()
            .map_or(table.columns().len(), |m| m.file_width());
        if let Some(columns) = &meta.columns {
            if columns.windows(2).any(|w| w[0] >= w[1])
                || columns.iter().any(|&c| c as usize >= width)
            {
                return Err(StorageError::Corruption(format!(
                    "{}: the metadata lists columns {columns:?} of {width}",
                    path.display()
                )));
            }
        }
        match &map {
            None => {
                let expected = file_schema(&table.arrow_schema(), meta.columns.as_deref());
                check_columns(&path, &metadata, &expected)?;
            }
            Some(map) => check_written_columns(&path, &metadata, &meta, map)?,
        }
        let rows: i64 = metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .sum();
        if rows as u64 != meta.records {
            return Err(StorageError::Corruption(format!(
                "{} holds {rows} records, the metadata says {}",
                path.display(),
                meta.records
            )));
        }
        Ok(DeltaFile {
            map: with_changed(map, &meta),
            meta,
            path,
            bytes,
            metadata,
        })
    }

    /// This file, read under the table's schema `current`, as a table with schema `table`
    /// reads it (see [`crate::column_map`]): the file is not read again.
    pub fn for_table(&self, current: &Schema, table: &Arc<Schema>) -> DeltaFile {
        let ids = self
            .meta
            .column_ids
            .clone()
            .unwrap_or_else(|| current.ids());
        let map = ColumnMap::by_ids(&ids, table);
        DeltaFile {
            meta: DeltaMeta {
                column_ids: map.is_some().then_some(ids),
                ..self.meta.clone()
            },
            map: with_changed(map, &self.meta),
            path: self.path.clone(),
            bytes: self.bytes,
            metadata: self.metadata.clone(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn disk_bytes(&self) -> u64 {
        self.bytes
    }

    /// The number of table columns in the file.
    fn width(&self) -> usize {
        self.metadata.schema().fields().len() - 3
    }

    /// Where table column `c` is in the file, if it stores it.
    fn root(&self, c: usize) -> Option<usize> {
        let c = match &self.map {
            Some((map, _)) => map.source(c)?,
            None => c,
        };
        match &self.meta.columns {
            None => (c < self.width()).then_some(c),
            Some(columns) => columns.iter().position(|&x| x as usize == c),
        }
    }

    /// Whether the records hold values of table column `c`. Full images written under an
    /// older schema hold every column: one added since has its DEFAULT in them.
    pub fn has(&self, c: usize) -> bool {
        self.root(c).is_some() || (self.map.is_some() && self.meta.columns.is_none())
    }

    /// The table columns that records may change (None = any).
    pub fn changed(&self) -> Option<&[u32]> {
        match &self.map {
            Some((_, changed)) => changed.as_deref(),
            None => self.meta.changed.as_deref(),
        }
    }

    /// All records, with those of the table columns `columns` (indexes into the table schema)
    /// that the file stores, in `columns` order.
    pub fn read(&self, columns: &[usize]) -> Result<Records, StorageError> {
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
            File::open(&self.path)?,
            self.metadata.clone(),
        );
        let width = self.width();
        let stored: Vec<usize> = columns.iter().filter_map(|&c| self.root(c)).collect();
        let mut roots = stored.clone();
        roots.extend([width, width + 1, width + 2]);
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let all = guard(&self.path, || {
            let reader = builder
                .with_projection(mask)
                .with_batch_size(64 * 1024)
                .build()?;
            let schema = arrow::array::RecordBatchReader::schema(&reader);
            let batches = reader.collect::<Result<Vec<_>, _>>()?;
            Ok(arrow::compute::concat_batches(&schema, &batches)?)
        })?;
        let bad =
            || StorageError::Corruption(format!("{}: bad record columns", self.path.display()));
        let column = |name: &str| all.column_by_name(name).cloned().ok_or_else(bad);
        let ordinals = column(ORDINAL)?
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(bad)?
            .values()
            .to_vec();
        let ts = column(TS)?
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(bad)?
            .values()
            .to_vec();
        let deleted = column(DELETED)?.as_boolean_opt().ok_or_else(bad)?.clone();
        // Parquet returns the projected columns in file order; callers want `columns` order.
        let file_schema = self.metadata.schema();
        let mut fields = Vec::with_capacity(columns.len());
        let mut images = Vec::with_capacity(columns.len());
        match &self.map {
            None => {
                for &c in &stored {
                    let field = file_schema.field(c);
                    images.push(column(field.name())?);
                    fields.push(field.clone());
                }
            }
            // Under the table's names; in full images, columns added since by their DEFAULT.
            Some((map, _)) => {
                let table = map.table().arrow_schema();
                for &c in columns {
                    let field = table.field(c).clone().with_nullable(true);
                    match self.root(c) {
                        Some(root) => images.push(column(file_schema.field(root).name())?),
                        None if self.meta.columns.is_none() => {
                            images.push(default_column(&map.table().columns()[c], ordinals.len())?)
                        }
                        None => continue,
                    }
                    fields.push(field);
                }
            }
        }
        let images = RecordBatch::try_new_with_options(
            Arc::new(ArrowSchema::new(fields)),
            images,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(ordinals.len())),
        )?;
        Ok(Records {
            ordinals,
            ts,
            deleted,
            images,
        })
    }

    /// The full images (all table columns) of the records at `positions` (sorted), from a file
    /// that stores all columns.
    pub fn read_images(&self, positions: &[u32]) -> Result<RecordBatch, StorageError> {
        if self.meta.columns.is_some() {
            return Err(StorageError::Corruption(format!(
                "{} holds per-column records, not row images",
                self.path.display()
            )));
        }
        let roots: Vec<usize> = (0..self.width()).collect();
        let images = read_positions(&self.path, &self.metadata, &roots, positions)?;
        let Some((map, _)) = &self.map else {
            return Ok(images);
        };
        let table = map.table();
        let columns = (0..table.columns().len())
            .map(|c| match self.root(c) {
                Some(root) => Ok(images.column(root).clone()),
                None => default_column(&table.columns()[c], positions.len()),
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
        let fields: Vec<Field> = (table.arrow_schema().fields().iter())
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        Ok(RecordBatch::try_new_with_options(
            Arc::new(ArrowSchema::new(fields)),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(positions.len())),
        )?)
    }
}

/// `map` with the columns that `meta`'s records may change, as table columns.
fn with_changed(
    map: Option<Arc<ColumnMap>>,
    meta: &DeltaMeta,
) -> Option<(Arc<ColumnMap>, Option<Vec<u32>>)> {
    let map = map?;
    let changed = meta.changed.as_ref().map(|changed| {
        let table = changed.iter().filter_map(|&o| map.target(o as usize));
        table.map(|c| c as u32).collect()
    });
    Some((map, changed))
}

/// Checks that a delta file written under an older schema holds what its metadata says: the
/// columns it lists (all of those it was written with, else), then the record columns, each
/// column that the table still has of the table's type.
fn check_written_columns(
    path: &Path,
    metadata: &ArrowReaderMetadata,
    meta: &DeltaMeta,
    map: &ColumnMap,
) -> Result<(), StorageError> {
    let positions: Vec<usize> = match &meta.columns {
        Some(columns) => columns.iter().map(|&c| c as usize).collect(),
        None => (0..map.file_width()).collect(),
    };
    let fields = metadata.schema().fields();
    let table = map.table().arrow_schema();
    let types_match = (positions.iter().zip(fields.iter())).all(|(&o, field)| {
        map.target(o)
            .is_none_or(|c| table.field(c).data_type() == field.data_type())
    });
    if fields.len() != positions.len() + 3 || !types_match {
        return Err(StorageError::Corruption(format!(
            "{} does not hold the columns the tablet metadata says it holds",
            path.display()
        )));
    }
    Ok(())
}
