//! Delta stores: the history of rows that live in a DiskRowSet (Kudu paper, section 4.3).
//!
//! A DiskRowSet's base data is immutable and holds one image per row. Its history is kept in
//! version records keyed by the row's ordinal in the rowset:
//!
//! - **REDO** records describe changes after the base image: `(ordinal, ts, new image)`, or a
//!   deletion. New ones collect in the rowset's [`DeltaMemStore`] (images in the tablet's row
//!   arena); a flush writes them to a REDO [`DeltaFile`].
//! - **UNDO** records describe the versions before the base image: `(ordinal, ts, image before
//!   ts)`, where a missing image means the row did not exist before `ts`. They are written
//!   with the base data when a rowset is created (by a flush or a compaction).
//!
//! The state of a row at snapshot S is: the image of its oldest UNDO record with `ts > S` if
//! there is one; otherwise the image of its newest REDO record with `ts <= S`; otherwise the
//! base image. Records at or before the ancient history mark (the oldest snapshot a scan may
//! use) are never needed, so rewrites drop them, and a scan at a current snapshot reads no UNDO
//! file at all (its newest record is older than the snapshot).
//!
//! A delta file is a Parquet file: the table's columns (nullable), then `__ordinal`, `__ts` and
//! `__deleted`, sorted by (ordinal, ts).

use std::collections::BTreeMap;
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
use crate::diskrowset::{load_metadata, read_positions};
use crate::memrowset::{visible, RowArena, RowRef, Version};
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
}

/// Records read from a delta file, in file order.
pub struct Records {
    pub ordinals: Vec<u32>,
    pub ts: Vec<u64>,
    pub deleted: BooleanArray,
    /// The table columns asked for, one row per record (NULLs for deletions).
    pub images: RecordBatch,
}

fn file_schema(table: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Field> = table
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
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
    /// `sources` (batches with the table's columns), synced to disk.
    pub fn write(
        dir: &Path,
        id: u64,
        table: &Schema,
        sources: &[&RecordBatch],
        records: &[Record],
    ) -> Result<DeltaFile, StorageError> {
        let arrow_schema = table.arrow_schema();
        let schema = file_schema(&arrow_schema);
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
        let nulls: Vec<ArrayRef> = arrow_schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), 1))
            .collect();
        for chunk in records.chunks(64 * 1024) {
            let indices: Vec<(usize, usize)> = chunk
                .iter()
                .map(|r| r.image.unwrap_or((sources.len(), 0)))
                .collect();
            let mut columns = Vec::with_capacity(schema.fields().len());
            for (c, null) in nulls.iter().enumerate() {
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
            id,
            records: records.len() as u64,
            min_ts: records.iter().map(|r| r.ts).min().unwrap_or(Timestamp(0)),
            max_ts: records.iter().map(|r| r.ts).max().unwrap_or(Timestamp(0)),
        };
        Self::open(dir, meta)
    }

    /// Opens the delta file `meta` describes, checking its checksum.
    pub fn open(dir: &Path, meta: DeltaMeta) -> Result<DeltaFile, StorageError> {
        let path = dir.join(Self::file_name(meta.id));
        if let Some(expected) = meta.checksum {
            crate::checksum::verify(&path, expected)?;
        }
        let file = File::open(&path)?;
        let bytes = file.metadata()?.len();
        let metadata = load_metadata(&file)?;
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
            meta,
            path,
            bytes,
            metadata,
        })
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

    /// All records, with the table columns `columns` (indexes into the table schema).
    pub fn read(&self, columns: &[usize]) -> Result<Records, StorageError> {
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
            File::open(&self.path)?,
            self.metadata.clone(),
        );
        let width = self.width();
        let mut roots: Vec<usize> = columns.to_vec();
        roots.extend([width, width + 1, width + 2]);
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(64 * 1024)
            .build()?;
        let schema = arrow::array::RecordBatchReader::schema(&reader);
        let batches = reader.collect::<Result<Vec<_>, _>>()?;
        let all = arrow::compute::concat_batches(&schema, &batches)?;
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
        for &c in columns {
            let field = file_schema.field(c);
            images.push(column(field.name())?);
            fields.push(field.clone());
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

    /// The full images (all `width` table columns) of the records at `positions` (sorted).
    pub fn read_images(&self, positions: &[u32]) -> Result<RecordBatch, StorageError> {
        read_positions(&self.path, &self.metadata, self.width(), positions)
    }
}

/// Where a row's state at some snapshot comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    /// The base data.
    Base,
    /// A new image in the tablet's row arena.
    Mem(RowRef),
    /// A record in REDO file `file` of the rowset (`UNDO` for its UNDO file).
    File { file: usize, row: u32 },
    /// The row does not exist.
    Absent,
}

/// Marks the UNDO file in [`Image::File`].
pub const UNDO: usize = usize::MAX;

/// The newest REDO record of an ordinal across a rowset's REDO files.
#[derive(Clone, Copy, Debug)]
struct Latest {
    ordinal: u32,
    file: u32,
    row: u32,
    deleted: bool,
    ts: Timestamp,
}

/// Changes recorded since the last flush: versions of rows of one rowset, by ordinal.
#[derive(Default, Clone)]
pub struct DeltaMemStore {
    pub by_ordinal: BTreeMap<u32, Vec<Version>>,
}

impl DeltaMemStore {
    pub fn is_empty(&self) -> bool {
        self.by_ordinal.is_empty()
    }

    pub fn push(&mut self, ordinal: u32, version: Version) {
        self.by_ordinal.entry(ordinal).or_default().push(version);
    }

    /// The records to write as a REDO file, images in the arena.
    pub fn records(&self) -> Vec<Record> {
        self.by_ordinal
            .iter()
            .flat_map(|(&ordinal, versions)| {
                versions.iter().map(move |v| Record {
                    ordinal,
                    ts: v.ts,
                    image: v.row.map(|r| (r.batch as usize, r.row as usize)),
                })
            })
            .collect()
    }
}

/// The history of one rowset: its UNDO file, REDO files and DeltaMemStore.
#[derive(Default, Clone)]
pub struct RowsetDeltas {
    pub undo: Option<Arc<DeltaFile>>,
    pub redo: Vec<Arc<DeltaFile>>,
    /// The newest record of each ordinal in `redo`, sorted by ordinal.
    latest: Vec<Latest>,
    pub dms: DeltaMemStore,
}

impl RowsetDeltas {
    pub fn new(
        undo: Option<Arc<DeltaFile>>,
        redo: Vec<Arc<DeltaFile>>,
    ) -> Result<Self, StorageError> {
        let mut deltas = RowsetDeltas {
            undo,
            redo: Vec::new(),
            latest: Vec::new(),
            dms: DeltaMemStore::default(),
        };
        for file in redo {
            deltas.add_redo(file)?;
        }
        Ok(deltas)
    }

    /// Adds a REDO file newer than the ones the rowset has.
    pub fn add_redo(&mut self, file: Arc<DeltaFile>) -> Result<(), StorageError> {
        let records = file.read(&[])?;
        let f = self.redo.len() as u32;
        let mut newest: Vec<Latest> = Vec::new();
        for (row, (&ordinal, &ts)) in records.ordinals.iter().zip(&records.ts).enumerate() {
            let latest = Latest {
                ordinal,
                file: f,
                row: row as u32,
                deleted: records.deleted.value(row),
                ts: Timestamp(ts),
            };
            match newest.last_mut() {
                Some(last) if last.ordinal == ordinal => *last = latest,
                _ => newest.push(latest),
            }
        }
        // Merge: the new file's records win.
        let old = std::mem::take(&mut self.latest);
        let (mut a, mut b) = (old.into_iter().peekable(), newest.into_iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.ordinal < y.ordinal => a.next(),
                (Some(x), Some(y)) if x.ordinal == y.ordinal => {
                    a.next();
                    b.next()
                }
                (Some(_), None) => a.next(),
                (_, Some(_)) => b.next(),
                (None, None) => break,
            };
            self.latest.extend(next);
        }
        self.redo.push(file);
        Ok(())
    }

    /// The same files without the DeltaMemStore.
    pub fn without_dms(&self) -> RowsetDeltas {
        RowsetDeltas {
            undo: self.undo.clone(),
            redo: self.redo.clone(),
            latest: self.latest.clone(),
            dms: DeltaMemStore::default(),
        }
    }

    /// The rowset's delta files.
    pub fn files(&self) -> impl Iterator<Item = &Arc<DeltaFile>> {
        self.undo.iter().chain(&self.redo)
    }

    pub fn memory_bytes(&self) -> usize {
        self.latest.capacity() * std::mem::size_of::<Latest>()
    }

    pub fn redo_records(&self) -> u64 {
        self.redo.iter().map(|f| f.meta.records).sum::<u64>()
            + self
                .dms
                .by_ordinal
                .values()
                .map(|v| v.len() as u64)
                .sum::<u64>()
    }

    /// The newest state of the row at `ordinal`.
    pub fn latest(&self, ordinal: u32) -> Image {
        if let Some(v) = self.dms.by_ordinal.get(&ordinal).and_then(|v| v.last()) {
            return v.row.map_or(Image::Absent, Image::Mem);
        }
        match self.latest.binary_search_by_key(&ordinal, |l| l.ordinal) {
            Ok(i) if self.latest[i].deleted => Image::Absent,
            Ok(i) => Image::File {
                file: self.latest[i].file as usize,
                row: self.latest[i].row,
            },
            Err(_) => Image::Base,
        }
    }

    /// The state of the row at `ordinal` as a scan at `snapshot` sees it.
    pub fn at(&self, ordinal: u32, snapshot: Timestamp) -> Result<Image, StorageError> {
        if let Some(v) = self
            .dms
            .by_ordinal
            .get(&ordinal)
            .and_then(|v| visible(v, snapshot))
        {
            return Ok(v.row.map_or(Image::Absent, Image::Mem));
        }
        let newest = self
            .latest
            .binary_search_by_key(&ordinal, |l| l.ordinal)
            .ok()
            .map(|i| self.latest[i]);
        let undo_needed = self.undo.as_ref().is_some_and(|u| snapshot < u.meta.max_ts);
        match newest {
            Some(l) if l.ts <= snapshot => {
                return Ok(if l.deleted {
                    Image::Absent
                } else {
                    Image::File {
                        file: l.file as usize,
                        row: l.row,
                    }
                })
            }
            None if !undo_needed => return Ok(Image::Base),
            _ => {}
        }
        // An older version: search the files' records of this ordinal.
        let mut picks = Vec::new();
        self.pick_from_files(snapshot, &mut picks, Some(ordinal))?;
        Ok(picks.last().map_or(Image::Base, |p| p.1))
    }

    /// Appends to `picks` the state at `snapshot` of every ordinal (or just `only`) that the
    /// delta files change from the base image, oldest source first (see [`newest_per_ordinal`]).
    fn pick_from_files(
        &self,
        snapshot: Timestamp,
        picks: &mut Vec<(u32, Image)>,
        only: Option<u32>,
    ) -> Result<(), StorageError> {
        let wanted = |o: u32| only.is_none_or(|w| w == o);
        let image = |deleted: bool, file: usize, row: usize| match deleted {
            true => Image::Absent,
            false => Image::File {
                file,
                row: row as u32,
            },
        };
        if let Some(undo) = self.undo.as_ref().filter(|u| snapshot < u.meta.max_ts) {
            let records = undo.read(&[])?;
            let mut last = None;
            for (row, (&ordinal, &ts)) in records.ordinals.iter().zip(&records.ts).enumerate() {
                // The oldest record after the snapshot holds the image the snapshot sees.
                if ts > snapshot.0 && wanted(ordinal) && last != Some(ordinal) {
                    picks.push((ordinal, image(records.deleted.value(row), UNDO, row)));
                    last = Some(ordinal);
                }
            }
        }
        for (file, redo) in self.redo.iter().enumerate() {
            if redo.meta.min_ts > snapshot {
                continue;
            }
            let records = redo.read(&[])?;
            for (row, (&ordinal, &ts)) in records.ordinals.iter().zip(&records.ts).enumerate() {
                if ts <= snapshot.0 && wanted(ordinal) {
                    picks.push((ordinal, image(records.deleted.value(row), file, row)));
                }
            }
        }
        Ok(())
    }

    /// What a scan at `snapshot` changes in the base rows: the ordinals it must skip (sorted)
    /// and the images that replace them, with the table columns `columns`.
    pub fn view(
        &self,
        snapshot: Timestamp,
        table: &SchemaRef,
        columns: &[usize],
        arena: &RowArena,
    ) -> Result<(Vec<u32>, Vec<RecordBatch>), StorageError> {
        let mut picks = Vec::new();
        self.pick_from_files(snapshot, &mut picks, None)?;
        for (&ordinal, versions) in &self.dms.by_ordinal {
            if let Some(v) = visible(versions, snapshot) {
                picks.push((ordinal, v.row.map_or(Image::Absent, Image::Mem)));
            }
        }
        let picks = newest_per_ordinal(picks);
        let hidden: Vec<u32> = picks.iter().map(|p| p.0).collect();
        let mut batches = Vec::new();
        let mem: Vec<RowRef> = picks
            .iter()
            .filter_map(|(_, p)| match p {
                Image::Mem(r) => Some(*r),
                _ => None,
            })
            .collect();
        if !mem.is_empty() {
            batches.push(arena.gather(table, columns, &mem)?);
        }
        let projected = Arc::new(table.project(columns)?);
        let files = std::iter::once(UNDO).chain(0..self.redo.len());
        for file in files {
            let rows: Vec<u32> = picks
                .iter()
                .filter_map(|(_, p)| match p {
                    Image::File { file: f, row } if *f == file => Some(*row),
                    _ => None,
                })
                .collect();
            if rows.is_empty() {
                continue;
            }
            let source = if file == UNDO {
                self.undo.as_ref()
            } else {
                self.redo.get(file)
            }
            .ok_or_else(|| StorageError::Corruption("missing delta file".into()))?;
            let records = source.read(columns)?;
            let taken =
                arrow::compute::take_record_batch(&records.images, &UInt32Array::from(rows))?;
            batches.push(RecordBatch::try_new_with_options(
                projected.clone(),
                taken.columns().to_vec(),
                &arrow::array::RecordBatchOptions::new().with_row_count(Some(taken.num_rows())),
            )?);
        }
        Ok((hidden, batches))
    }

    /// The delta file an [`Image::File`] names.
    pub fn file(&self, file: usize) -> Option<&Arc<DeltaFile>> {
        if file == UNDO {
            self.undo.as_ref()
        } else {
            self.redo.get(file)
        }
    }
}

/// The last pick of each ordinal (later picks come from newer sources), sorted by ordinal.
fn newest_per_ordinal(mut picks: Vec<(u32, Image)>) -> Vec<(u32, Image)> {
    // Stable: picks of one ordinal keep their order.
    picks.sort_by_key(|p| p.0);
    let mut out: Vec<(u32, Image)> = Vec::with_capacity(picks.len());
    for pick in picks {
        match out.last_mut() {
            Some(last) if last.0 == pick.0 => *last = pick,
            _ => out.push(pick),
        }
    }
    out
}
