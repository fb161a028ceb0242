//! A rowset's delta stores together (Kudu's DeltaTracker): UNDO files, REDO files and the
//! DeltaMemStore, and which of their records gives a row's state at a snapshot.
//!
//! A row's newest state, and its state at any snapshot after its newest REDO record, are found
//! without reading a file: an index of each ordinal's newest REDO record is kept in memory,
//! built when a REDO file is added. Older states are read from the files when a snapshot needs
//! them (UNDO files only by snapshots older than their newest record).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::memstore::DeltaMemStore;
use super::DeltaFile;
use crate::memrowset::{visible, RowRef};
use crate::{StorageError, Timestamp};

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

/// The UNDO record of one file that a snapshot needs for one ordinal: the file's oldest record
/// of that ordinal newer than the snapshot.
#[derive(Clone, Copy, Debug)]
pub(super) struct UndoPick {
    /// Index into [`RowsetDeltas::undo`].
    pub(super) file: usize,
    pub(super) row: u32,
    /// The row did not exist before the record.
    pub(super) absent: bool,
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

    /// These deltas, read under the table's schema `current`, as a table with schema `table`
    /// reads them (see [`DeltaFile::for_table`]); records in memory keep their images.
    pub fn for_table(&self, current: &crate::Schema, table: &Arc<crate::Schema>) -> RowsetDeltas {
        let files = |files: &[Arc<DeltaFile>]| -> Vec<Arc<DeltaFile>> {
            (files.iter())
                .map(|f| Arc::new(f.for_table(current, table)))
                .collect()
        };
        RowsetDeltas {
            undo: files(&self.undo),
            redo: files(&self.redo),
            ..self.clone()
        }
    }

    /// Adds a REDO file newer than the ones the rowset has.
    pub fn add_redo(&mut self, file: Arc<DeltaFile>) -> Result<(), StorageError> {
        // Only UNDO files hold per-column records (a major delta compaction writes them).
        if file.meta.columns.is_some() {
            return Err(StorageError::Corruption(format!(
                "{}: a REDO file with per-column records",
                file.path().display()
            )));
        }
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

    /// Whether the row at `ordinal` has a version newer than `snapshot`. Its base image counts as
    /// newer when any UNDO file of the rowset holds a record newer than the snapshot (the rowset
    /// was written from versions after it): a cheap check that may answer yes for a row that did
    /// not change, never no for one that did.
    pub fn changed_after(&self, ordinal: u32, snapshot: Timestamp) -> bool {
        let in_memory = (self.dms.by_ordinal.get(&ordinal).and_then(|v| v.last())).or_else(|| {
            let frozen = self.frozen.as_ref()?;
            frozen.by_ordinal.get(&ordinal)?.last()
        });
        if let Some(v) = in_memory {
            return v.ts > snapshot;
        }
        match self.latest.binary_search_by_key(&ordinal, |l| l.ordinal) {
            Ok(i) => self.latest[i].ts > snapshot,
            Err(_) => self.undo.iter().any(|u| u.meta.max_ts > snapshot),
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
            return Ok(undo_image(picks));
        }
        let mut picks = Vec::new();
        self.redo_picks(snapshot, &mut picks, Some(ordinal))?;
        Ok(picks.last().map_or(Image::Base, |p| p.1))
    }

    /// For every ordinal (or just `only`) with UNDO records newer than `snapshot`: the oldest
    /// such record of each UNDO file, oldest file first; sorted by ordinal.
    pub(super) fn undo_picks(
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
    /// files change from the base image, older records first (see `newest_per_ordinal` in
    /// `view.rs`).
    pub(super) fn redo_picks(
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
    /// The newest state of the row at `ordinal` that the files give (ignoring the
    /// DeltaMemStore).
    pub(super) fn latest_in_files(&self, ordinal: u32) -> Image {
        match self.latest.binary_search_by_key(&ordinal, |l| l.ordinal) {
            Ok(i) if self.latest[i].deleted => Image::Absent,
            Ok(i) => Image::File {
                file: self.latest[i].file as usize,
                row: self.latest[i].row,
            },
            Err(_) => Image::Base,
        }
    }

    /// The REDO file an [`Image::File`] names.
    pub fn file(&self, file: usize) -> Option<&Arc<DeltaFile>> {
        self.redo.get(file)
    }
}

/// The state a row's UNDO records `picks` (oldest file first) give it.
pub(super) fn undo_image(picks: &[UndoPick]) -> Image {
    if picks[0].absent {
        Image::Absent
    } else {
        Image::Undo
    }
}
