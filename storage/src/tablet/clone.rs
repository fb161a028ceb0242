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
//! A clone `as_of` an earlier time must not hold the versions written after it. Rowsets whose
//! versions are all at or before that time (their delta files say so) are linked as they are;
//! the others are rewritten from their version chains cut at that time, which drops the newer
//! versions, so only rowsets written to since then are copied.
//!
//! Transactions not yet committed stay behind: the clone holds committed rows only.

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
    /// now, or as of `as_of`. Called in log order (the tablet's Raft apply), so no write
    /// arrives meanwhile; one flush, compaction or schema change at a time still holds. A
    /// failure leaves `dir` incomplete: without metadata it is not a tablet.
    pub fn make_clone(&self, dir: &Path, as_of: Option<Timestamp>) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        if let Some(t) = as_of {
            let ancient = self.ancient_history_mark();
            if t < ancient {
                return Err(StorageError::SnapshotTooOld {
                    snapshot: t.display(),
                    oldest: ancient.display(),
                });
            }
        }
        if self.has_prepared_txns() {
            // Their commit timestamps may lie before this entry's: which side of the clone
            // they fall on is not known yet.
            return Err(StorageError::TxnState(
                "transactions are committing in the table; clone it again in a moment".into(),
            ));
        }
        self.flush_rewriting()?;
        let snap = {
            let state = self.state.read();
            let in_memory = !state.mrs.is_empty() || state.deltas.iter().any(|d| !d.dms.is_empty());
            if in_memory {
                return Err(StorageError::TxnState(
                    "the table was written to while it was cloned".into(),
                ));
            }
            Snapshot::of(&state)
        };
        std::fs::create_dir_all(dir)?;
        let no_failures = |_: &str| Ok(());
        let mut files = NewFiles {
            dir,
            next_id: snap.next_rowset_id,
            paths: Vec::new(),
            fail: &no_failures,
            key_cache: &self.options.key_cache,
        };
        let mut rowsets = Vec::with_capacity(snap.rowsets.len());
        let mut deltas = Vec::with_capacity(snap.rowsets.len());
        let ancient = self.ancient_history_mark();
        for (rowset, history) in snap.rowsets.iter().zip(&snap.deltas) {
            let newest = history.files().map(|f| f.meta.max_ts).max();
            match as_of {
                Some(t) if newest.is_some_and(|newest| newest > t) => {
                    for new in cut_at(rowset, history, t, &snap, &mut files, ancient)? {
                        rowsets.push(new.rowset);
                        deltas.push(new.deltas);
                    }
                }
                _ => {
                    let (rowset, history) =
                        (std::slice::from_ref(rowset), std::slice::from_ref(history));
                    for path in paths(rowset, history) {
                        let name = path.file_name().ok_or_else(|| {
                            StorageError::Corruption(format!("{} has no file name", path.display()))
                        })?;
                        std::fs::hard_link(path, dir.join(name))?;
                    }
                    rowsets.push(rowset[0].clone());
                    deltas.push(history[0].without_dms());
                }
            }
        }
        // The clone's log starts empty: its files are durable up to entry 0.
        let meta = Metadata::of(
            &snap.schema,
            &rowsets,
            &deltas,
            files.next_id,
            0,
            self.next_auto_id(),
            None,
        );
        // New files are synced as they are written, links share synced files; the metadata's
        // write syncs the directory with their names.
        write_metadata(dir, &meta, &no_failures)
    }
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
