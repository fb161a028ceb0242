//! Table clones (Castle's snapshots): a new tablet that starts with this tablet's committed
//! rows and is independent from then on.
//!
//! DiskRowSet and delta files are immutable, so a clone shares them: after a flush (which puts
//! everything in memory into files), each file the metadata names is hard-linked into the new
//! tablet's directory, whose own metadata then names the links. Either tablet's later flushes
//! and compactions write new files and unlink the ones they replace; a file's data is freed
//! when the last tablet naming it lets go. Cloning costs a flush and a few links per rowset,
//! whatever the table's size.
//!
//! A clone `as_of` an earlier time must not hold the versions written after it. Delta files
//! record their oldest and newest timestamps, and a rowset's UNDO records include its base
//! images' own: a rowset whose base data is no newer than that time is linked, with the REDO
//! files no newer than it (updates made since are left behind); a rowset with newer base data
//! (flushed after that time), or with a REDO file that spans it, is rewritten from its version
//! chains cut at that time. So only what was flushed or compacted since costs a copy.
//!
//! Transactions not yet committed stay behind: the clone holds committed rows only. A queue
//! table's clone assigns positions above every position the source had assigned (its
//! `position_base`), as its own log starts anew.

use std::path::Path;

use super::metadata::{write_metadata, Metadata};
use super::rewrite::{paths, Snapshot};
use super::Tablet;
use crate::delta::RowsetDeltas;
use crate::diskrowset::DiskRowSet;
use crate::history::{self, NewFiles};
use crate::{StorageError, Timestamp};

impl Tablet {
    /// Makes `dir` (which must not exist) a new tablet with this tablet's committed rows as of
    /// log entry `index`, or as of `as_of`. Called in log order, as the tablet's Raft apply of
    /// entry `index`, so no write arrives meanwhile; the flush it starts with makes the files
    /// durable up to that entry, which is therefore not replayed. A failure leaves `dir`
    /// incomplete: without metadata it is not a tablet.
    pub fn make_clone(
        &self,
        dir: &Path,
        index: u64,
        as_of: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        if let Some(t) = as_of {
            self.check_history(t)?;
        }
        if self.has_prepared_txns() {
            // Their commit timestamps may lie before this entry's: which side of the clone
            // they fall on is not known yet.
            return Err(StorageError::TxnState(
                "transactions are committing in the table; clone it again in a moment".into(),
            ));
        }
        {
            let mut state = self.state.write();
            state.last_applied = state.last_applied.max(index);
        }
        self.flush_rewriting()?;
        let (snap, position_base) = {
            let state = self.state.read();
            let in_memory = !state.mrs.is_empty() || state.deltas.iter().any(|d| !d.dms.is_empty());
            if in_memory {
                return Err(StorageError::TxnState(
                    "the table was written to while it was cloned".into(),
                ));
            }
            (Snapshot::of(&state), state.entry_position(index))
        };
        std::fs::create_dir_all(dir)?;
        let no_failures = |_: &str| Ok(());
        let mut files = NewFiles {
            dir,
            next_id: snap.next_rowset_id,
            paths: Vec::new(),
            fail: &no_failures,
            page_cache: &self.options.page_cache,
        };
        let mut rowsets = Vec::with_capacity(snap.rowsets.len());
        let mut deltas = Vec::with_capacity(snap.rowsets.len());
        let ancient = self.ancient_history_mark();
        for (rowset, history) in snap.rowsets.iter().zip(&snap.deltas) {
            let kept = match as_of {
                None => history.without_dms(),
                Some(t) => match history_until(history, t)? {
                    Some(kept) => kept,
                    None => {
                        for new in cut_at(rowset, history, t, &snap, &mut files, ancient)? {
                            rowsets.push(new.rowset);
                            deltas.push(new.deltas);
                        }
                        continue;
                    }
                },
            };
            let (linked, with) = (std::slice::from_ref(rowset), std::slice::from_ref(&kept));
            for path in paths(linked, with) {
                let name = path.file_name().ok_or_else(|| {
                    StorageError::Corruption(format!("{} has no file name", path.display()))
                })?;
                std::fs::hard_link(path, dir.join(name))?;
            }
            rowsets.push(rowset.clone());
            deltas.push(kept);
        }
        // The clone's log starts empty: its files are durable up to entry 0.
        let meta = Metadata {
            position_base,
            ..Metadata::of(
                &snap.schema,
                &rowsets,
                &deltas,
                files.next_id,
                0,
                self.next_auto_id(),
                None,
            )
        };
        // New files are synced as they are written, links share synced files; the metadata's
        // write syncs the directory with their names.
        write_metadata(dir, &meta, &no_failures)
    }
}

/// The delta files of a rowset that give its rows as of `t` when its base data is kept as it
/// is: its UNDO files and the REDO files no newer than `t`. None if that is not enough (base
/// data newer than `t`, or a REDO file with records on both sides of it).
fn history_until(
    history: &RowsetDeltas,
    t: Timestamp,
) -> Result<Option<RowsetDeltas>, StorageError> {
    let newer = |f: &std::sync::Arc<crate::delta::DeltaFile>| f.meta.max_ts > t;
    let spans = |f: &std::sync::Arc<crate::delta::DeltaFile>| f.meta.min_ts <= t && newer(f);
    if history.undo.iter().any(newer) || history.redo.iter().any(spans) {
        return Ok(None);
    }
    let redo = (history.redo.iter().filter(|f| !newer(f))).cloned();
    Ok(Some(RowsetDeltas::new(
        history.undo.clone(),
        redo.collect(),
    )?))
}

/// The rows of `rowset` rewritten into `files` with every version after `t` left out.
fn cut_at(
    rowset: &DiskRowSet,
    history: &RowsetDeltas,
    t: Timestamp,
    snap: &Snapshot,
    files: &mut NewFiles,
    ancient: Timestamp,
) -> Result<Vec<history::NewRowset>, StorageError> {
    let mut images = Vec::new();
    let width = snap.schema.columns().len();
    let chains = history::rowset_chains(rowset, &history.without_dms(), width, &mut images)?;
    let chains = chains.into_iter().map(|mut chain| {
        chain.versions.retain(|(ts, _)| *ts <= t);
        chain
    });
    let sources: Vec<_> = images.iter().collect();
    let rows = rowset.num_rows().max(1);
    history::write_chains(files, &snap.schema, &sources, chains, ancient, rows)
}
