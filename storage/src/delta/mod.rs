//! Delta stores: the history of rows that live in a DiskRowSet (Kudu paper, section 4.3).
//!
//! A DiskRowSet's base data is immutable and holds one image per row. Its history is kept in
//! version records keyed by the row's ordinal in the rowset:
//!
//! - **REDO** records describe changes after the base image: `(ordinal, ts, new image)`, or a
//!   deletion. New ones collect in the rowset's [`DeltaMemStore`] (images in the tablet's row
//!   arena); a flush writes them to a REDO [`DeltaFile`], which records the columns they may
//!   change ([`DeltaMeta::changed`]).
//! - **UNDO** records describe the versions before the base image: `(ordinal, ts, image before
//!   ts)`, where a missing image means the row did not exist before `ts`. They are written
//!   with the base data when a rowset is created (by a flush or a compaction). A major delta
//!   compaction that rewrites only some columns writes another UNDO file holding only those
//!   columns ([`DeltaMeta::columns`]): per-column records, whose other columns are those of
//!   the next newer version.
//!
//! The state of a row at snapshot S is: if it has UNDO records with `ts > S`, the base image
//! with each column taken from the oldest of them that holds the column (absent if the oldest
//! says the row did not exist yet); otherwise the image of its newest REDO record with
//! `ts <= S`; otherwise the base image. An UNDO file's records are older than the next UNDO
//! file's, and a row's REDO records newer than its UNDO records. Records at or before the
//! ancient history mark (the oldest snapshot a scan may use) are never needed, so rewrites drop
//! them, and a scan at a current snapshot reads no UNDO file at all (their newest records are
//! older than the snapshot).
//!
//! A delta file is a Parquet file: the table's columns it holds (nullable), then `__ordinal`,
//! `__ts` and `__deleted`, sorted by (ordinal, ts).

use std::collections::{BTreeMap, BTreeSet};
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
use crate::diskrowset::{load_metadata, read_positions, DiskRowSet};
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
    /// The table columns (positions) whose values the file stores; None = all. A file with
    /// some columns holds per-column records: the other columns are those of the next newer
    /// version (for UNDO records, written by a major delta compaction that rewrote only them).
    #[serde(default)]
    pub columns: Option<Vec<u32>>,
    /// The table columns that records may change relative to the version before; None = any.
    /// A major delta compaction rewrites only these.
    #[serde(default)]
    pub changed: Option<Vec<u32>>,
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
            columns: layout.columns,
            changed: layout.changed,
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

    /// Where table column `c` is in the file, if it stores it.
    fn root(&self, c: usize) -> Option<usize> {
        match &self.meta.columns {
            None => (c < self.width()).then_some(c),
            Some(columns) => columns.iter().position(|&x| x as usize == c),
        }
    }

    /// Whether the records hold values of table column `c`.
    pub fn has(&self, c: usize) -> bool {
        self.root(c).is_some()
    }

    /// The table columns that records may change (None = any).
    pub fn changed(&self) -> Option<&[u32]> {
        self.meta.changed.as_deref()
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
        for &c in &stored {
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
        read_positions(&self.path, &self.metadata, &roots, positions)
    }
}

/// Where a row's state at some snapshot comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    /// The base data.
    Base,
    /// A new image in the tablet's row arena.
    Mem(RowRef),
    /// A record in REDO file `file` of the rowset.
    File { file: usize, row: u32 },
    /// The base data with UNDO records applied (see [`RowsetDeltas::view`]).
    Undo,
    /// The row does not exist.
    Absent,
}

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
    /// The table columns the versions may change (see [`DeltaMeta::changed`]).
    pub changed: BTreeSet<u32>,
    /// How many versions are deletions.
    deletions: usize,
}

impl DeltaMemStore {
    pub fn is_empty(&self) -> bool {
        self.by_ordinal.is_empty()
    }

    pub fn push(&mut self, ordinal: u32, version: Version) {
        self.deletions += usize::from(version.row.is_none());
        self.by_ordinal.entry(ordinal).or_default().push(version);
    }

    /// Adds the versions of rows this store has none of yet (each row once).
    pub fn add_rows(&mut self, mut rows: Vec<(u32, Vec<Version>)>) {
        let deletions = rows.iter().flat_map(|r| &r.1).filter(|v| v.row.is_none());
        self.deletions += deletions.count();
        rows.sort_unstable_by_key(|r| r.0);
        match self.by_ordinal.is_empty() {
            // Built at once from sorted rows.
            true => self.by_ordinal = rows.into_iter().collect(),
            false => self.by_ordinal.extend(rows),
        }
    }

    /// Whether a scan of `columns` sees nothing of this store: it deletes no row and changes
    /// none of the columns.
    fn invisible_to(&self, columns: &[usize]) -> bool {
        self.deletions == 0 && !columns.iter().any(|&c| self.changed.contains(&(c as u32)))
    }
}

/// An image put together column by column: each column from a row of the arena, or else from
/// `under`, the state the row's DeltaMemStore versions apply to (a REDO record or the base row).
struct Composed {
    ordinal: u32,
    under: Image,
    /// Where its cells are in the cells of all images (one per column).
    cells: std::ops::Range<usize>,
}

/// The UNDO record of one file that a snapshot needs for one ordinal: the file's oldest record
/// of that ordinal newer than the snapshot.
#[derive(Clone, Copy, Debug)]
struct UndoPick {
    /// Index into [`RowsetDeltas::undo`].
    file: usize,
    row: u32,
    /// The row did not exist before the record.
    absent: bool,
}

/// The history of one rowset: its UNDO files, REDO files and DeltaMemStore.
#[derive(Default, Clone)]
pub struct RowsetDeltas {
    /// Oldest first: for any row, the records of a file are older than those of the next.
    pub undo: Vec<Arc<DeltaFile>>,
    pub redo: Vec<Arc<DeltaFile>>,
    /// The newest record of each ordinal in `redo`, sorted by ordinal.
    latest: Arc<Vec<Latest>>,
    pub dms: DeltaMemStore,
    /// The DeltaMemStore a flush is writing (readable until the flush switches): its versions
    /// are older than those of `dms`.
    pub frozen: Option<Arc<DeltaMemStore>>,
}

impl RowsetDeltas {
    pub fn new(undo: Vec<Arc<DeltaFile>>, redo: Vec<Arc<DeltaFile>>) -> Result<Self, StorageError> {
        let mut deltas = RowsetDeltas {
            undo,
            redo: Vec::new(),
            latest: Arc::default(),
            dms: DeltaMemStore::default(),
            frozen: None,
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
        let mut merged = Vec::with_capacity(old.len() + newest.len());
        let (mut a, mut b) = (
            old.iter().copied().peekable(),
            newest.into_iter().peekable(),
        );
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
            merged.extend(next);
        }
        self.latest = Arc::new(merged);
        self.redo.push(file);
        Ok(())
    }

    /// The same files without the DeltaMemStores.
    pub fn without_dms(&self) -> RowsetDeltas {
        RowsetDeltas {
            undo: self.undo.clone(),
            redo: self.redo.clone(),
            latest: self.latest.clone(),
            dms: DeltaMemStore::default(),
            frozen: None,
        }
    }

    /// The DeltaMemStore versions of `ordinal`, oldest first.
    fn dms_versions(&self, ordinal: u32) -> std::borrow::Cow<'_, [Version]> {
        let live = self
            .dms
            .by_ordinal
            .get(&ordinal)
            .map_or(&[][..], Vec::as_slice);
        let frozen = (self.frozen.as_ref()).and_then(|f| f.by_ordinal.get(&ordinal));
        match frozen {
            None => live.into(),
            Some(older) if live.is_empty() => older.as_slice().into(),
            Some(older) => [older.as_slice(), live].concat().into(),
        }
    }

    /// Every ordinal with DeltaMemStore versions, with its versions, in ordinal order.
    fn dms_entries(&self) -> std::borrow::Cow<'_, BTreeMap<u32, Vec<Version>>> {
        let Some(frozen) = &self.frozen else {
            return std::borrow::Cow::Borrowed(&self.dms.by_ordinal);
        };
        let mut all = frozen.by_ordinal.clone();
        for (ordinal, versions) in &self.dms.by_ordinal {
            all.entry(*ordinal).or_default().extend(versions);
        }
        std::borrow::Cow::Owned(all)
    }

    /// Undoes a flush's freeze: the frozen store's versions go back before the newer ones.
    pub fn thaw(&mut self) {
        if let Some(frozen) = self.frozen.take() {
            let newer = std::mem::replace(&mut self.dms, (*frozen).clone());
            for (ordinal, versions) in newer.by_ordinal {
                for version in versions {
                    self.dms.push(ordinal, version);
                }
            }
            self.dms.changed.extend(newer.changed);
        }
    }

    /// The rowset's delta files.
    pub fn files(&self) -> impl Iterator<Item = &Arc<DeltaFile>> {
        self.undo.iter().chain(&self.redo)
    }

    pub fn memory_bytes(&self) -> usize {
        self.latest.capacity() * std::mem::size_of::<Latest>()
    }

    /// The REDO records (files and memory) that rewriting the rowset would apply to its base
    /// data: all but those of files holding only deletions newer than `ancient` (a deleted row
    /// stays in its rowset, deleted, until the deletion is older than the history retention).
    pub fn applicable_redo_records(&self, ancient: Timestamp) -> u64 {
        let only_recent_deletions =
            |f: &DeltaFile| f.changed().is_some_and(<[u32]>::is_empty) && f.meta.max_ts > ancient;
        let files = self.redo.iter().filter(|f| !only_recent_deletions(f));
        let stores = std::iter::once(&self.dms).chain(self.frozen.as_deref());
        let in_memory = stores.flat_map(|s| s.by_ordinal.values().map(|v| v.len() as u64));
        files.map(|f| f.meta.records).sum::<u64>() + in_memory.sum::<u64>()
    }

    /// The table columns that REDO records (files and memory) may change; None = any.
    pub fn changed_columns(&self) -> Option<BTreeSet<u32>> {
        let mut changed = self.dms.changed.clone();
        changed.extend(self.frozen.iter().flat_map(|f| f.changed.iter()));
        for file in &self.redo {
            changed.extend(file.changed()?);
        }
        Some(changed)
    }

    /// The newest state of the row at `ordinal`.
    pub fn latest(&self, ordinal: u32) -> Image {
        match self.dms_versions(ordinal).last() {
            Some(v) => v.row.map_or(Image::Absent, Image::Mem),
            None => self.latest_in_files(ordinal),
        }
    }

    /// The state of the row at `ordinal` as a scan at `snapshot` sees it.
    pub fn at(&self, ordinal: u32, snapshot: Timestamp) -> Result<Image, StorageError> {
        if let Some(v) = visible(&self.dms_versions(ordinal), snapshot) {
            return Ok(v.row.map_or(Image::Absent, Image::Mem));
        }
        let newest = self
            .latest
            .binary_search_by_key(&ordinal, |l| l.ordinal)
            .ok()
            .map(|i| self.latest[i]);
        let undo_needed = self.undo.iter().any(|u| snapshot < u.meta.max_ts);
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
        if let Some((_, picks)) = self.undo_picks(snapshot, Some(ordinal))?.first() {
            return Ok(if picks[0].absent {
                Image::Absent
            } else {
                Image::Undo
            });
        }
        let mut picks = Vec::new();
        self.redo_picks(snapshot, &mut picks, Some(ordinal))?;
        Ok(picks.last().map_or(Image::Base, |p| p.1))
    }

    /// For every ordinal (or just `only`) with UNDO records newer than `snapshot`: the oldest
    /// such record of each UNDO file, oldest file first; sorted by ordinal.
    fn undo_picks(
        &self,
        snapshot: Timestamp,
        only: Option<u32>,
    ) -> Result<Vec<(u32, Vec<UndoPick>)>, StorageError> {
        let mut picks: BTreeMap<u32, Vec<UndoPick>> = BTreeMap::new();
        for (file, undo) in self.undo.iter().enumerate() {
            if snapshot >= undo.meta.max_ts {
                continue;
            }
            let records = undo.read(&[])?;
            let mut last = None;
            for (row, (&ordinal, &ts)) in records.ordinals.iter().zip(&records.ts).enumerate() {
                if ts > snapshot.0 && only.is_none_or(|o| o == ordinal) && last != Some(ordinal) {
                    picks.entry(ordinal).or_default().push(UndoPick {
                        file,
                        row: row as u32,
                        absent: records.deleted.value(row),
                    });
                    last = Some(ordinal);
                }
            }
        }
        Ok(picks.into_iter().collect())
    }

    /// Appends to `picks` the state at `snapshot` of every ordinal (or just `only`) that REDO
    /// files change from the base image, older records first (see [`newest_per_ordinal`]).
    fn redo_picks(
        &self,
        snapshot: Timestamp,
        picks: &mut Vec<(u32, Image)>,
        only: Option<u32>,
    ) -> Result<(), StorageError> {
        for (file, redo) in self.redo.iter().enumerate() {
            if redo.meta.min_ts > snapshot {
                continue;
            }
            let records = redo.read(&[])?;
            for (row, (&ordinal, &ts)) in records.ordinals.iter().zip(&records.ts).enumerate() {
                if ts <= snapshot.0 && only.is_none_or(|o| o == ordinal) {
                    let image = match records.deleted.value(row) {
                        true => Image::Absent,
                        false => Image::File {
                            file,
                            row: row as u32,
                        },
                    };
                    picks.push((ordinal, image));
                }
            }
        }
        Ok(())
    }

    /// What a scan at `snapshot` changes in the base rows of `rowset` (or only in the row at
    /// `only`): the ordinals it must skip (sorted) and the images that replace them, with the
    /// table columns `columns`.
    pub fn view(
        &self,
        rowset: &DiskRowSet,
        snapshot: Timestamp,
        table: &SchemaRef,
        columns: &[usize],
        arena: &RowArena,
        only: Option<u32>,
    ) -> Result<(Vec<u32>, Vec<RecordBatch>), StorageError> {
        let undo = self.undo_picks(snapshot, only)?;
        let mut picks: Vec<(u32, Image)> = undo
            .iter()
            .map(|(o, p)| {
                (
                    *o,
                    if p[0].absent {
                        Image::Absent
                    } else {
                        Image::Undo
                    },
                )
            })
            .collect();
        // An ordinal's REDO records are newer than its UNDO records: none of them is visible
        // where an UNDO record is.
        self.redo_picks(snapshot, &mut picks, only)?;
        // DeltaMemStore versions (newer than every REDO record): a row whose visible versions
        // change none of the columns read keeps the state the files give it.
        let mut composed = Vec::new();
        let mut cells = Vec::new();
        let stores = std::iter::once(&self.dms).chain(self.frozen.as_deref());
        let dms = match stores.clone().all(|s| s.invisible_to(columns)) {
            true => None,
            false => Some(self.dms_entries()),
        };
        for (&ordinal, versions) in dms.iter().flat_map(|d| d.iter()) {
            if only.is_some_and(|o| o != ordinal) {
                continue;
            }
            let seen = versions.partition_point(|v| v.ts <= snapshot);
            let Some(newest) = seen.checked_sub(1).map(|i| &versions[i]) else {
                continue;
            };
            let Some(row) = newest.row else {
                picks.push((ordinal, Image::Absent));
                continue;
            };
            let start = cells.len();
            dms_cells(&versions[..seen], columns, arena, &mut cells);
            let mine = &cells[start..];
            if mine.iter().any(Option::is_some) {
                picks.push((ordinal, Image::Mem(row)));
                let under = match mine.iter().any(Option::is_none) {
                    true => self.latest_in_files(ordinal),
                    false => Image::Base, // not read
                };
                composed.push(Composed {
                    ordinal,
                    under,
                    cells: start..cells.len(),
                });
            } else {
                cells.truncate(start);
            }
        }
        let picks = newest_per_ordinal(picks);
        let hidden: Vec<u32> = picks.iter().map(|p| p.0).collect();
        let mut batches = Vec::new();
        let projected = Arc::new(table.project(columns)?);
        let with_rows = |n: usize| arrow::array::RecordBatchOptions::new().with_row_count(Some(n));
        if !composed.is_empty() {
            let images = self.materialize(rowset, columns, arena, &composed, &cells)?;
            batches.push(RecordBatch::try_new_with_options(
                projected.clone(),
                images,
                &with_rows(composed.len()),
            )?);
        }
        for (file, source) in self.redo.iter().enumerate() {
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
            let records = source.read(columns)?;
            let taken =
                arrow::compute::take_record_batch(&records.images, &UInt32Array::from(rows))?;
            batches.push(RecordBatch::try_new_with_options(
                projected.clone(),
                taken.columns().to_vec(),
                &with_rows(taken.num_rows()),
            )?);
        }
        let composed: Vec<&(u32, Vec<UndoPick>)> =
            undo.iter().filter(|(_, p)| !p[0].absent).collect();
        if !composed.is_empty() {
            let images = self.compose_undo(rowset, table, columns, &composed)?;
            batches.push(RecordBatch::try_new_with_options(
                projected,
                images,
                &with_rows(composed.len()),
            )?);
        }
        Ok((hidden, batches))
    }

    /// The images (columns `columns`) that UNDO records give the rows of `picks`: each column
    /// from the oldest picked record that holds it, or else from the base data.
    fn compose_undo(
        &self,
        rowset: &DiskRowSet,
        table: &SchemaRef,
        columns: &[usize],
        picks: &[&(u32, Vec<UndoPick>)],
    ) -> Result<Vec<ArrayRef>, StorageError> {
        let files: BTreeSet<usize> = picks
            .iter()
            .flat_map(|(_, p)| p.iter().map(|p| p.file))
            .collect();
        let mut records = BTreeMap::new();
        for &f in &files {
            records.insert(f, self.undo[f].read(columns)?);
        }
        // The base data of the rows some column of which no picked record holds.
        let from_base = |p: &[UndoPick], c: usize| !p.iter().any(|p| self.undo[p.file].has(c));
        let base_rows: Vec<u32> = picks
            .iter()
            .filter(|(_, p)| columns.iter().any(|&c| from_base(p, c)))
            .map(|(o, _)| *o)
            .collect();
        let base = match base_rows.is_empty() {
            true => None,
            false => Some(rowset.read_rows(columns, &base_rows)?),
        };
        let mut out = Vec::with_capacity(columns.len());
        for (i, &c) in columns.iter().enumerate() {
            let name = table.field(c).name();
            // Sources: the base rows, then each file's records.
            let mut arrays: Vec<&dyn Array> = Vec::new();
            let mut slot = BTreeMap::new();
            if let Some(base) = &base {
                arrays.push(base.column(i).as_ref());
            }
            for (f, r) in &records {
                if let Some(column) = r.images.column_by_name(name) {
                    slot.insert(*f, arrays.len());
                    arrays.push(column.as_ref());
                }
            }
            let mut indices = Vec::with_capacity(picks.len());
            for (ordinal, p) in picks.iter().copied() {
                match p.iter().find(|p| slot.contains_key(&p.file)) {
                    Some(p) => indices.push((slot[&p.file], p.row as usize)),
                    None => {
                        let row = base_rows.binary_search(ordinal).map_err(|_| {
                            StorageError::Corruption("base row of an UNDO image not read".into())
                        })?;
                        indices.push((0, row));
                    }
                }
            }
            out.push(interleave(&arrays, &indices)?);
        }
        Ok(out)
    }

    /// The newest state of the row at `ordinal` that the files give (ignoring the
    /// DeltaMemStore).
    fn latest_in_files(&self, ordinal: u32) -> Image {
        match self.latest.binary_search_by_key(&ordinal, |l| l.ordinal) {
            Ok(i) if self.latest[i].deleted => Image::Absent,
            Ok(i) => Image::File {
                file: self.latest[i].file as usize,
                row: self.latest[i].row,
            },
            Err(_) => Image::Base,
        }
    }

    /// The columns `columns` of `images`, each cell from the arena or from the image's
    /// `under` state (REDO images and base rows read as needed).
    fn materialize(
        &self,
        rowset: &DiskRowSet,
        columns: &[usize],
        arena: &RowArena,
        images: &[Composed],
        cells: &[Option<RowRef>],
    ) -> Result<Vec<ArrayRef>, StorageError> {
        let needs_under = |i: &Composed| cells[i.cells.clone()].iter().any(Option::is_none);
        let mut base_rows: Vec<u32> = Vec::new();
        let mut redo_rows: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for image in images.iter().filter(|i| needs_under(i)) {
            match image.under {
                Image::File { file, row } => redo_rows.entry(file).or_default().push(row),
                _ => base_rows.push(image.ordinal),
            }
        }
        base_rows.sort_unstable();
        base_rows.dedup();
        let base = match base_rows.is_empty() {
            true => None,
            false => Some(rowset.read_rows(columns, &base_rows)?),
        };
        let mut redo = Vec::new();
        for (file, mut rows) in redo_rows {
            rows.sort_unstable();
            rows.dedup();
            let source = self
                .file(file)
                .ok_or_else(|| StorageError::Corruption("missing delta file".into()))?;
            let read = source.read_images(&rows)?.project(columns)?;
            redo.push((file, rows, read));
        }
        let missing = || StorageError::Corruption("a row image was not read".into());
        let mut out = Vec::with_capacity(columns.len());
        for (j, &c) in columns.iter().enumerate() {
            // Sources: the arena's batches, then the base rows, then each REDO file's rows.
            let mut arrays: Vec<&dyn Array> = arena.column_sources(c);
            let base_source = arrays.len();
            if let Some(base) = &base {
                arrays.push(base.column(j).as_ref());
            }
            let redo_source = arrays.len();
            arrays.extend(redo.iter().map(|(_, _, read)| read.column(j).as_ref()));
            let mut indices = Vec::with_capacity(images.len());
            for image in images {
                indices.push(match (cells[image.cells.start + j], image.under) {
                    (Some(r), _) => arena.index(r),
                    (None, Image::File { file, row }) => {
                        let k = redo.iter().position(|r| r.0 == file).ok_or_else(missing)?;
                        let at = redo[k].1.binary_search(&row).map_err(|_| missing())?;
                        (redo_source + k, at)
                    }
                    (None, _) => {
                        let at = base_rows
                            .binary_search(&image.ordinal)
                            .map_err(|_| missing())?;
                        (base_source, at)
                    }
                });
            }
            out.push(interleave(&arrays, &indices)?);
        }
        Ok(out)
    }

    /// The frozen DeltaMemStore as REDO records with full images (each version's columns over
    /// the version before, the first over the state the files give), and the batch of the
    /// images.
    pub fn frozen_records(
        &self,
        rowset: &DiskRowSet,
        table: &SchemaRef,
        arena: &RowArena,
    ) -> Result<(Vec<Record>, RecordBatch), StorageError> {
        let all: Vec<usize> = (0..table.fields().len()).collect();
        let mut records = Vec::new();
        let mut images = Vec::new();
        let mut cells = Vec::new();
        let frozen = self.frozen.as_deref().map(|f| &f.by_ordinal);
        for (&ordinal, versions) in frozen.into_iter().flatten() {
            for (i, v) in versions.iter().enumerate() {
                let image = v.row.map(|_| {
                    let start = cells.len();
                    dms_cells(&versions[..=i], &all, arena, &mut cells);
                    images.push(Composed {
                        ordinal,
                        under: self.latest_in_files(ordinal),
                        cells: start..cells.len(),
                    });
                    (0, images.len() - 1)
                });
                records.push(Record {
                    ordinal,
                    ts: v.ts,
                    image,
                });
            }
        }
        let schema = crate::history::nullable(table);
        if images.is_empty() {
            // Only deletions.
            return Ok((records, RecordBatch::new_empty(schema)));
        }
        let columns = self.materialize(rowset, &all, arena, &images, &cells)?;
        let batch = RecordBatch::try_new(schema, columns)?;
        Ok((records, batch))
    }

    /// The REDO file an [`Image::File`] names.
    pub fn file(&self, file: usize) -> Option<&Arc<DeltaFile>> {
        self.redo.get(file)
    }
}

/// Appends, for each of `columns`, the newest of `versions` (live ones, oldest first) that
/// holds it.
fn dms_cells(
    versions: &[Version],
    columns: &[usize],
    arena: &RowArena,
    cells: &mut Vec<Option<RowRef>>,
) {
    cells.extend(columns.iter().map(|&c| {
        versions
            .iter()
            .rev()
            .filter_map(|v| v.row)
            .find(|&r| arena.holds(r, c))
    }));
}

/// The last pick of each ordinal (later picks come from newer sources), sorted by ordinal.
fn newest_per_ordinal(mut picks: Vec<(u32, Image)>) -> Vec<(u32, Image)> {
    // Stable: picks of one ordinal keep their order. (Picks of one source come sorted.)
    if !picks.is_sorted_by_key(|p| p.0) {
        picks.sort_by_key(|p| p.0);
    }
    let mut out: Vec<(u32, Image)> = Vec::with_capacity(picks.len());
    for pick in picks {
        match out.last_mut() {
            Some(last) if last.0 == pick.0 => *last = pick,
            _ => out.push(pick),
        }
    }
    out
}
