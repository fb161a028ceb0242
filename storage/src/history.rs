//! Row histories as version chains, and rowsets written from them.
//!
//! A flush, a compaction and a schema change all do the same thing: take the full version
//! chain of every row they move (from the MemRowSet, or rebuilt from a rowset's UNDO records,
//! base image and REDO records), and write new rowsets in which each row's newest live image
//! is the base data, the versions before it become UNDO records and a final deletion becomes a
//! REDO record. History that no allowed snapshot can see (at or before the ancient history
//! mark) is dropped on the way, as are rows deleted before it.

use std::sync::Arc;

use arrow::array::{Array, RecordBatch};
use arrow::compute::interleave;

use crate::delta::{DeltaFile, Record, RowsetDeltas};
use crate::diskrowset::DiskRowSet;
use crate::{Schema, StorageError, Timestamp};

/// A row image: (source batch, row) in the sources of a rewrite.
pub type ImageRef = (usize, usize);

/// The versions of one key, oldest first; `None` is a deletion. A version with timestamp 0
/// started before the ancient history mark (its real start was forgotten).
pub struct Chain {
    pub key: Vec<u8>,
    pub versions: Vec<(Timestamp, Option<ImageRef>)>,
}

/// A rowset to add to the tablet: its base data and history files.
pub struct NewRowset {
    pub rowset: Arc<DiskRowSet>,
    pub deltas: RowsetDeltas,
}

/// Files written by one operation, removed again if it fails before its metadata is written.
pub struct NewFiles<'a> {
    pub dir: &'a std::path::Path,
    pub next_id: u64,
    pub paths: Vec<std::path::PathBuf>,
    /// Called after each file is written (crash tests).
    pub fail: &'a dyn Fn(&str) -> Result<(), StorageError>,
}

impl NewFiles<'_> {
    pub fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    pub fn delta(
        &mut self,
        schema: &Schema,
        sources: &[&RecordBatch],
        records: &[Record],
    ) -> Result<Arc<DeltaFile>, StorageError> {
        let id = self.take_id();
        self.paths.push(self.dir.join(DeltaFile::file_name(id)));
        let file = DeltaFile::write(self.dir, id, schema, sources, records)?;
        (self.fail)("delta_written")?;
        Ok(Arc::new(file))
    }

    pub fn remove_all(&self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes `chains` (in key order) as rowsets of at most `rows_per_rowset` rows.
pub fn write_chains(
    files: &mut NewFiles,
    schema: &Schema,
    sources: &[&RecordBatch],
    chains: impl IntoIterator<Item = Chain>,
    ancient: Timestamp,
    rows_per_rowset: usize,
) -> Result<Vec<NewRowset>, StorageError> {
    let mut out = Vec::new();
    let mut pending = Pending::default();
    for chain in chains {
        let versions = &chain.versions;
        // The newest live image becomes the base; a row never live, or deleted for good before
        // the ancient history mark, is gone.
        let Some(b) = versions.iter().rposition(|v| v.1.is_some()) else {
            continue;
        };
        if let Some((ts, None)) = versions.last() {
            if *ts <= ancient {
                continue;
            }
        }
        let ordinal = pending.keys.len() as u32;
        for i in 0..=b {
            if versions[i].0 > ancient {
                pending.undo.push(Record {
                    ordinal,
                    ts: versions[i].0,
                    image: i.checked_sub(1).and_then(|p| versions[p].1),
                });
            }
        }
        for &(ts, image) in &versions[b + 1..] {
            pending.redo.push(Record { ordinal, ts, image });
        }
        pending.base.push(versions[b].1.expect("live version"));
        pending.keys.push(chain.key);
        if pending.keys.len() >= rows_per_rowset {
            out.push(std::mem::take(&mut pending).write(files, schema, sources)?);
        }
    }
    if !pending.keys.is_empty() {
        out.push(pending.write(files, schema, sources)?);
    }
    Ok(out)
}

#[derive(Default)]
struct Pending {
    keys: Vec<Vec<u8>>,
    base: Vec<ImageRef>,
    undo: Vec<Record>,
    redo: Vec<Record>,
}

impl Pending {
    fn write(
        self,
        files: &mut NewFiles,
        schema: &Schema,
        sources: &[&RecordBatch],
    ) -> Result<NewRowset, StorageError> {
        let table = schema.arrow_schema();
        let mut batches = Vec::new();
        for part in self.base.chunks(64 * 1024) {
            let columns = (0..table.fields().len())
                .map(|c| {
                    let arrays: Vec<&dyn Array> =
                        sources.iter().map(|b| b.column(c).as_ref()).collect();
                    interleave(&arrays, part)
                })
                .collect::<Result<Vec<_>, _>>()?;
            batches.push(RecordBatch::try_new(table.clone(), columns)?);
        }
        let id = files.take_id();
        files.paths.push(files.dir.join(DiskRowSet::file_name(id)));
        let rowset = DiskRowSet::write(files.dir, id, schema, &batches, self.keys)?;
        (files.fail)("rowset_written")?;
        let undo = match self.undo.is_empty() {
            true => None,
            false => Some(files.delta(schema, sources, &self.undo)?),
        };
        let redo = match self.redo.is_empty() {
            true => vec![],
            false => vec![files.delta(schema, sources, &self.redo)?],
        };
        Ok(NewRowset {
            rowset: Arc::new(rowset),
            deltas: RowsetDeltas::new(undo, redo)?,
        })
    }
}

/// The chains of every row of a rowset whose DeltaMemStore is empty, rebuilt from its files.
/// Their images are added to `sources`.
pub fn rowset_chains(
    rowset: &DiskRowSet,
    deltas: &RowsetDeltas,
    width: usize,
    sources: &mut Vec<RecordBatch>,
) -> Result<Vec<Chain>, StorageError> {
    debug_assert!(deltas.dms.is_empty());
    let n = rowset.num_rows();
    let all: Vec<usize> = (0..width).collect();
    let base = sources.len();
    sources.push(rowset.read_rows(width, &(0..n as u32).collect::<Vec<_>>())?);
    let mut undo = None;
    if let Some(file) = &deltas.undo {
        let records = file.read(&all)?;
        sources.push(records.images.clone());
        undo = Some((sources.len() - 1, records));
    }
    let mut redo = Vec::new();
    for file in &deltas.redo {
        let records = file.read(&all)?;
        sources.push(records.images.clone());
        redo.push((sources.len() - 1, records));
    }
    let mut undo_pos = 0;
    let mut redo_pos = vec![0; redo.len()];
    let mut chains = Vec::with_capacity(n);
    for ordinal in 0..n as u32 {
        let mut versions = Vec::new();
        let base_image = Some((base, ordinal as usize));
        // UNDO records (ts, image before ts): the version starting at each ts is the image
        // before the next record, or the base image after the last.
        let mut started = false;
        if let Some((source, records)) = &undo {
            while undo_pos < records.ordinals.len() && records.ordinals[undo_pos] == ordinal {
                let before = (!records.deleted.value(undo_pos)).then_some((*source, undo_pos));
                match versions.last_mut() {
                    Some((_, image)) if started => *image = before,
                    _ => {
                        if before.is_some() {
                            versions.push((Timestamp(0), before));
                        }
                    }
                }
                versions.push((Timestamp(records.ts[undo_pos]), base_image));
                started = true;
                undo_pos += 1;
            }
        }
        if !started {
            versions.push((Timestamp(0), base_image));
        }
        for ((source, records), pos) in redo.iter().zip(&mut redo_pos) {
            while *pos < records.ordinals.len() && records.ordinals[*pos] == ordinal {
                let image = (!records.deleted.value(*pos)).then_some((*source, *pos));
                versions.push((Timestamp(records.ts[*pos]), image));
                *pos += 1;
            }
        }
        chains.push(Chain {
            key: rowset.key(ordinal).to_vec(),
            versions,
        });
    }
    Ok(chains)
}

/// Merges the chains of several rowsets (each in key order) into one chain per key, in key
/// order. Chains of a key deleted before the ancient history mark are dropped first: the
/// others have disjoint lifetimes, so their versions sort by timestamp.
pub fn merge_chains(parts: Vec<Vec<Chain>>, ancient: Timestamp) -> Vec<Chain> {
    let dead = |c: &Chain| matches!(c.versions.last(), Some((ts, None)) if *ts <= ancient);
    let mut all: Vec<Chain> = parts.into_iter().flatten().filter(|c| !dead(c)).collect();
    all.sort_by(|a, b| a.key.cmp(&b.key));
    let mut merged: Vec<Chain> = Vec::with_capacity(all.len());
    for chain in all {
        match merged.last_mut() {
            Some(last) if last.key == chain.key => {
                last.versions.extend(chain.versions);
                last.versions.sort_by_key(|v| v.0);
            }
            _ => merged.push(chain),
        }
    }
    merged
}
