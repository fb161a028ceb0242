//! What a scan at a snapshot reads of a rowset instead of its base rows: the ordinals to skip,
//! and the images that replace them, each put together column by column.
//!
//! An image may come from several places at once (per-column UNDO records over the base row, or
//! partial DeltaMemStore versions over a REDO image or the base row), so images are composed as
//! cells that name their source and are then gathered with one `interleave` per column. The
//! base rows and REDO images needed are read once for all images, and a scan whose columns the
//! in-memory versions leave alone does not look at them at all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::interleave;
use arrow::datatypes::SchemaRef;

use super::tracker::{undo_image, UndoPick};
use super::{Image, Record, RowsetDeltas};
use crate::diskrowset::DiskRowSet;
use crate::memrowset::{RowArena, RowRef, Version};
use crate::{StorageError, Timestamp};

/// An image put together column by column: each column from a row of the arena, or else from
/// `under`, the state the row's DeltaMemStore versions apply to (a REDO record or the base row).
struct Composed {
    ordinal: u32,
    under: Image,
    /// Where its cells are in the cells of all images (one per column).
    cells: std::ops::Range<usize>,
}

/// What a scan at a snapshot sees differently from a rowset's base rows
/// ([`RowsetDeltas::view_rows`]).
pub struct View {
    /// The ordinals whose base rows the snapshot does not see, sorted: those of `images`, and
    /// the rows that do not exist at the snapshot.
    pub hidden: Vec<u32>,
    /// The images that replace base rows, each batch with the ordinal of each of its rows.
    pub images: Vec<(RecordBatch, Vec<u32>)>,
}

impl RowsetDeltas {
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
        let view = self.view_rows(rowset, snapshot, table, columns, arena, only)?;
        Ok((view.hidden, view.images.into_iter().map(|i| i.0).collect()))
    }

    /// [`RowsetDeltas::view`], saying which row each image is of.
    pub fn view_rows(
        &self,
        rowset: &DiskRowSet,
        snapshot: Timestamp,
        table: &SchemaRef,
        columns: &[usize],
        arena: &RowArena,
        only: Option<u32>,
    ) -> Result<View, StorageError> {
        let undo = self.undo_picks(snapshot, only)?;
        let mut picks: Vec<(u32, Image)> = undo.iter().map(|(o, p)| (*o, undo_image(p))).collect();
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
            batches.push((
                RecordBatch::try_new_with_options(
                    projected.clone(),
                    images,
                    &with_rows(composed.len()),
                )?,
                composed.iter().map(|c| c.ordinal).collect(),
            ));
        }
        for (file, source) in self.redo.iter().enumerate() {
            let (ordinals, rows): (Vec<u32>, Vec<u32>) = picks
                .iter()
                .filter_map(|(o, p)| match p {
                    Image::File { file: f, row } if *f == file => Some((*o, *row)),
                    _ => None,
                })
                .unzip();
            if rows.is_empty() {
                continue;
            }
            let records = source.read(columns)?;
            let rows = UInt32Array::from(rows);
            // Column by column: a batch of no columns (count(*)) keeps its row count.
            let taken = (records.images.columns().iter())
                .map(|c| arrow::compute::take(c, &rows, None))
                .collect::<Result<Vec<_>, _>>()?;
            batches.push((
                RecordBatch::try_new_with_options(
                    projected.clone(),
                    taken,
                    &with_rows(rows.len()),
                )?,
                ordinals,
            ));
        }
        let composed: Vec<&(u32, Vec<UndoPick>)> =
            undo.iter().filter(|(_, p)| !p[0].absent).collect();
        if !composed.is_empty() {
            let images = self.compose_undo(rowset, table, columns, &composed)?;
            batches.push((
                RecordBatch::try_new_with_options(projected, images, &with_rows(composed.len()))?,
                composed.iter().map(|(o, _)| *o).collect(),
            ));
        }
        Ok(View {
            hidden,
            images: batches,
        })
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
        let held = arena.batches_holding(
            images
                .iter()
                .flat_map(|image| cells[image.cells.clone()].iter().flatten().copied()),
        );
        let mut out = Vec::with_capacity(columns.len());
        for (j, &c) in columns.iter().enumerate() {
            // Sources: the arena's batches holding cells read, then the base rows, then each
            // REDO file's rows.
            let mut arrays: Vec<&dyn Array> = arena.column_sources(&held, c);
            let base_source = arrays.len();
            if let Some(base) = &base {
                arrays.push(base.column(j).as_ref());
            }
            let redo_source = arrays.len();
            arrays.extend(redo.iter().map(|(_, _, read)| read.column(j).as_ref()));
            let mut indices = Vec::with_capacity(images.len());
            for image in images {
                indices.push(match (cells[image.cells.start + j], image.under) {
                    (Some(r), _) => arena.source_index(&held, r),
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
