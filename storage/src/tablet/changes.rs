//! Diff scans (Kudu's): the rows whose keys changed within a window of time, each key once, as
//! it is at the window's end, with how it changed and when it last did.
//!
//! The window is `(since, snapshot]`. A key changed in it if one of its versions starts inside:
//! in the MemRowSet its versions say so; in a DiskRowSet, its records in the delta files that
//! reach past `since` and its DeltaMemStore versions do. For each such key the scan takes its
//! state at both ends of the window (a rowset's images at a snapshot, as scans take them) and
//! reports
//! - `insert`: no row at `since`, a row at the snapshot (that row);
//! - `update`: a row at both ends (the row at the snapshot);
//! - `delete`: no row at the snapshot (the row as it was at `since`; only its key, the other
//!   columns NULL, if it had no row then either: inserted and deleted within the window),
//!
//! with its commit time, that of its last change in the window. A key deleted from one rowset
//! and inserted again lives in another (or the MemRowSet): its states are merged by key.
//!
//! The work is done under the tablet's read lock (a flush or compaction removes the files it
//! replaced as soon as it switches), in proportion to the rows changed and the delta files
//! that reach past `since`: a rowset nothing changed since then is not read.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, StringArray,
    TimestampMicrosecondArray,
};
use arrow::compute::{filter_record_batch, interleave, nullif};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};

use super::scan::{read_columns, string_views};
use super::{State, Tablet};
use crate::delta::{RowsetDeltas, View};
use crate::diskrowset::DiskRowSet;
use crate::history::nullable;
use crate::memrowset::{visible, MemRowSet, RowArena, RowRef, Version};
use crate::scan::{predicate_mask, ScanIterator, ScanSpec};
use crate::{StorageError, Timestamp};

/// The column a diff scan adds after the projection: `insert`, `update` or `delete`.
pub const CHANGE_COLUMN: &str = "_change";
/// The column after it: the time of the key's last change in the window (microseconds).
pub const COMMIT_TIME_COLUMN: &str = "_commit_time";

/// The two columns a diff scan adds after the projection.
pub fn change_fields() -> [Field; 2] {
    [
        Field::new(CHANGE_COLUMN, DataType::Utf8, false),
        Field::new(
            COMMIT_TIME_COLUMN,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]
}

/// An image among a diff scan's sources: (source batch, row).
type ImageRef = (usize, usize);

#[derive(Clone, Copy)]
struct Window {
    since: Timestamp,
    to: Timestamp,
}

impl Window {
    fn holds(self, ts: Timestamp) -> bool {
        ts > self.since && ts <= self.to
    }
}

/// What a diff scan found of one key in one place (the MemRowSet or a rowset).
struct Changed {
    key: Vec<u8>,
    /// The time of its newest version in the window.
    last: Timestamp,
    /// Its image at the window's start and at its end, where it had a row.
    since: Option<ImageRef>,
    at: Option<ImageRef>,
    /// An image holding its key columns.
    any: ImageRef,
}

impl Changed {
    /// Adds what another place holds of the same key (at most one place has a row at a time).
    fn merge(&mut self, other: Changed) {
        self.last = self.last.max(other.last);
        self.since = self.since.or(other.since);
        self.at = self.at.or(other.at);
    }
}

impl Tablet {
    /// The diff scan `spec` asks for (see [`ScanSpec::changes_since`]).
    pub(super) fn scan_changes(
        &self,
        spec: &ScanSpec,
        since: Timestamp,
    ) -> Result<ScanIterator, StorageError> {
        let window = Window {
            since,
            to: spec.snapshot,
        };
        if window.since >= window.to {
            return Ok(Box::new(std::iter::empty()));
        }
        let state = self.state.read();
        let schema = state.schema.clone();
        let (read, output_len) = read_columns(&schema, spec)?;
        let table = schema.arrow_schema();
        let projected = nullable(&Arc::new(table.project(&read)?));
        let mut sources = Vec::new();
        let mut found = mem_changes(&state, &table, &read, window, &mut sources)?;
        for (rowset, deltas) in state.rowsets.iter().zip(&state.deltas) {
            let place = Place {
                rowset,
                deltas,
                arena: &state.arena,
                table: &table,
                read: &read,
                projected: &projected,
            };
            place.changes(window, &mut sources, &mut found)?;
        }
        drop(state);
        // One entry per key.
        found.sort_by(|a, b| a.key.cmp(&b.key));
        let mut keys: Vec<Changed> = Vec::with_capacity(found.len());
        for changed in found {
            match keys.last_mut() {
                Some(last) if last.key == changed.key => last.merge(changed),
                _ => keys.push(changed),
            }
        }
        if keys.is_empty() {
            return Ok(Box::new(std::iter::empty()));
        }
        let mut fields: Vec<Field> = (projected.fields().iter())
            .map(|f| f.as_ref().clone())
            .collect();
        fields.extend(change_fields());
        let out_schema = Arc::new(ArrowSchema::new(fields));
        let n = keys.len();
        let mut images = Vec::with_capacity(n);
        let mut changes = Vec::with_capacity(n);
        let mut times = Vec::with_capacity(n);
        let mut bare = Vec::with_capacity(n);
        for key in &keys {
            let (image, change, key_only) = match (key.since, key.at) {
                (None, Some(at)) => (at, "insert", false),
                (Some(_), Some(at)) => (at, "update", false),
                (Some(since), None) => (since, "delete", false),
                (None, None) => (key.any, "delete", true),
            };
            images.push(image);
            changes.push(change);
            times.push(key.last.micros() as i64);
            bare.push(key_only);
        }
        let bare = BooleanArray::from(bare);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(read.len() + 2);
        for (j, &c) in read.iter().enumerate() {
            let arrays: Vec<&dyn Array> = sources.iter().map(|s| s.column(j).as_ref()).collect();
            let column = interleave(&arrays, &images)?;
            columns.push(match schema.is_key_column(c) || bare.true_count() == 0 {
                true => column,
                false => nullif(&column, &bare)?,
            });
        }
        columns.push(Arc::new(StringArray::from(changes)));
        columns.push(Arc::new(TimestampMicrosecondArray::from(times)));
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        let mut batch = RecordBatch::try_new_with_options(out_schema, columns, &options)?;
        if !spec.predicates.is_empty() {
            let mask = predicate_mask(&schema, &spec.predicates, &batch)?;
            batch = filter_record_batch(&batch, &mask)?;
        }
        let keep: Vec<usize> = (0..output_len)
            .chain([read.len(), read.len() + 1])
            .collect();
        let mut batch = batch.project(&keep)?;
        if let Some(limit) = spec.limit {
            batch = batch.slice(0, batch.num_rows().min(limit));
        }
        if spec.string_views {
            batch = string_views(batch)?;
        }
        let size = spec.batch_size.max(1);
        let batches: Vec<_> = (0..batch.num_rows())
            .step_by(size)
            .map(|start| Ok(batch.slice(start, size.min(batch.num_rows() - start))))
            .collect();
        Ok(Box::new(batches.into_iter()))
    }
}

/// The keys of the MemRowSet (and of the MemRowSet a flush is writing) changed in `window`.
fn mem_changes(
    state: &State,
    table: &SchemaRef,
    read: &[usize],
    window: Window,
    sources: &mut Vec<RecordBatch>,
) -> Result<Vec<Changed>, StorageError> {
    let source = sources.len();
    let mut rows: Vec<RowRef> = Vec::new();
    let mut found = Vec::new();
    let mut add = |key: &[u8], versions: &[Version]| {
        let Some(last) = (versions.iter().rev().map(|v| v.ts)).find(|&ts| ts <= window.to) else {
            return;
        };
        if !window.holds(last) {
            return;
        }
        // Every key's versions begin with a row (an insert) in one of the two.
        let Some(any) = versions.iter().find_map(|v| v.row) else {
            return;
        };
        let mut place = |row: RowRef| {
            rows.push(row);
            (source, rows.len() - 1)
        };
        found.push(Changed {
            key: key.to_vec(),
            last,
            since: visible(versions, window.since)
                .and_then(|v| v.row)
                .map(&mut place),
            at: visible(versions, window.to)
                .and_then(|v| v.row)
                .map(&mut place),
            any: place(any),
        });
    };
    let frozen = state.frozen.as_deref();
    // Nothing newer than the window's start: no key to walk (a long poll's usual first look).
    let newest = state
        .mrs
        .newest()
        .max(frozen.map_or(Timestamp(0), MemRowSet::newest));
    if newest <= window.since {
        return Ok(found);
    }
    for (key, versions) in state.mrs.index.iter() {
        match frozen.and_then(|f| f.index.get(key)) {
            Some(older) => add(&key[..], &[older.as_slice(), versions.as_slice()].concat()),
            None => add(&key[..], versions),
        }
    }
    if let Some(frozen) = frozen {
        for (key, versions) in frozen.index.iter() {
            if state.mrs.index.get(key).is_none() {
                add(&key[..], versions);
            }
        }
    }
    if !found.is_empty() {
        sources.push(state.arena.gather(table, read, &rows)?);
    }
    Ok(found)
}

/// A rowset and what a diff scan reads of it.
struct Place<'a> {
    rowset: &'a DiskRowSet,
    deltas: &'a RowsetDeltas,
    arena: &'a RowArena,
    table: &'a SchemaRef,
    read: &'a [usize],
    /// The columns read, as every source holds them.
    projected: &'a SchemaRef,
}

/// A rowset row's state at one end of a window.
#[derive(Clone, Copy)]
enum RowState {
    Image(ImageRef),
    Base,
    Absent,
}

impl Place<'_> {
    /// Adds to `found` the rows of the rowset changed in `window`.
    fn changes(
        &self,
        window: Window,
        sources: &mut Vec<RecordBatch>,
        found: &mut Vec<Changed>,
    ) -> Result<(), StorageError> {
        // The newest change in the window of each row with one.
        let mut last: BTreeMap<u32, Timestamp> = BTreeMap::new();
        let mut note = |ordinal: u32, ts: Timestamp| {
            if window.holds(ts) {
                let newest = last.entry(ordinal).or_insert(ts);
                *newest = (*newest).max(ts);
            }
        };
        let files = self.deltas.files();
        for file in files.filter(|f| f.meta.max_ts > window.since && f.meta.min_ts <= window.to) {
            let records = file.read(&[])?;
            for (&ordinal, &ts) in records.ordinals.iter().zip(&records.ts) {
                note(ordinal, Timestamp(ts));
            }
        }
        let stores = std::iter::once(&self.deltas.dms).chain(self.deltas.frozen.as_deref());
        for store in stores {
            for (&ordinal, versions) in &store.by_ordinal {
                for v in versions {
                    note(ordinal, v.ts);
                }
            }
        }
        if last.is_empty() {
            return Ok(());
        }
        let at = self.states(window.to, &last, sources)?;
        let since = self.states(window.since, &last, sources)?;
        // The base rows needed: for states that are the base row, and for keys.
        let ordinals: Vec<u32> = last.keys().copied().collect();
        let base_ordinals: Vec<u32> = (ordinals.iter().enumerate())
            .filter(|(i, _)| {
                !matches!(
                    (since[*i], at[*i]),
                    (RowState::Image(_), RowState::Image(_))
                )
            })
            .map(|(_, &o)| o)
            .collect();
        let base_source = sources.len();
        if !base_ordinals.is_empty() {
            let base = self.rowset.read_rows(self.read, &base_ordinals)?;
            sources.push(conform(base, self.projected)?);
        }
        // (Every row whose state at either end is not an image has its base row read.)
        let base = |o: u32| -> ImageRef {
            let row = base_ordinals.binary_search(&o).unwrap_or_default();
            (base_source, row)
        };
        let keys = self.rowset.read_key_rows(&ordinals)?;
        for (i, (&ordinal, &ts)) in last.iter().enumerate() {
            let image = |state: RowState| match state {
                RowState::Image(image) => Some(image),
                RowState::Base => Some(base(ordinal)),
                RowState::Absent => None,
            };
            let (since, at) = (image(since[i]), image(at[i]));
            found.push(Changed {
                key: keys.value(i).to_vec(),
                last: ts,
                since,
                at,
                any: at.or(since).unwrap_or_else(|| base(ordinal)),
            });
        }
        Ok(())
    }

    /// The state at `snapshot` of each row of `rows` (in their order), its images added to
    /// `sources`.
    fn states(
        &self,
        snapshot: Timestamp,
        rows: &BTreeMap<u32, Timestamp>,
        sources: &mut Vec<RecordBatch>,
    ) -> Result<Vec<RowState>, StorageError> {
        let View { hidden, images } = self.deltas.view_rows(
            self.rowset,
            snapshot,
            self.table,
            self.read,
            self.arena,
            None,
        )?;
        let mut imaged: HashMap<u32, ImageRef> = HashMap::new();
        for (batch, ordinals) in images {
            let source = sources.len();
            let wanted = (ordinals.iter().enumerate()).filter(|(_, o)| rows.contains_key(o));
            let before = imaged.len();
            imaged.extend(wanted.map(|(row, &o)| (o, (source, row))));
            if imaged.len() > before {
                sources.push(conform(batch, self.projected)?);
            }
        }
        Ok(rows
            .keys()
            .map(|o| match imaged.get(o) {
                Some(&image) => RowState::Image(image),
                None if hidden.binary_search(o).is_ok() => RowState::Absent,
                None => RowState::Base,
            })
            .collect())
    }
}

/// `batch` with the column types of `like`: every source of a diff scan is gathered from with
/// one `interleave` per column.
fn conform(batch: RecordBatch, like: &SchemaRef) -> Result<RecordBatch, StorageError> {
    let same =
        (batch.columns().iter().zip(like.fields())).all(|(c, f)| c.data_type() == f.data_type());
    if same {
        return Ok(batch);
    }
    let columns = (batch.columns().iter().zip(like.fields()))
        .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        like.clone(),
        columns,
        &options,
    )?)
}
