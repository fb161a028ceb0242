//! Switching a tablet to rewritten files while writes go on.
//!
//! A flush, a compaction and a schema change all work the same way: take a [`Snapshot`] of the
//! tablet, write new files from it without holding a lock, then under the write lock carry over
//! what writes changed meanwhile and switch with one metadata write. Rows keep their identity
//! across the switch by key: a rowset rewritten with the same rows in the same order keeps its
//! DeltaMemStore as it is; changes to rows that moved to new rowsets follow them to their new
//! ordinals ([`Moves`], found before the switch as far as possible so the write lock is held
//! briefly). A failure before the switch removes the new files and leaves the tablet as it was
//! (a flush's frozen stores are thawed).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::metadata::Metadata;
use super::{key_ranges, txn, State, Tablet};
use crate::delta::{Image, RowsetDeltas};
use crate::diskrowset::DiskRowSet;
use crate::history::{self, NewFiles};
use crate::key::KeyMap;
use crate::memrowset::{MemRowSet, RowArena, Versions};
use crate::{Schema, StorageError};

impl Tablet {
    /// Runs `f` to write new files from `snap` (no lock held: scans and writes go on), then,
    /// under the write lock, carries over what writes changed meanwhile, switches to the
    /// rowsets `f` returns with one metadata write (naming `schema` and `durable_index`), and
    /// removes the files no longer named. A failure before the switch removes the new files
    /// and leaves the tablet as it was.
    ///
    /// The caller holds `rewriting`: one flush, compaction or schema change at a time.
    pub(super) fn rewrite<F>(
        &self,
        snap: &Snapshot,
        schema: &Schema,
        durable_index: u64,
        carry: Carry,
        f: F,
    ) -> Result<(), StorageError>
    where
        F: FnOnce(&Snapshot, &mut NewFiles) -> Result<Vec<Output>, StorageError>,
    {
        let fail = |step: &str| self.fail(step);
        let mut files = NewFiles {
            dir: &self.dir,
            next_id: snap.next_rowset_id,
            paths: Vec::new(),
            fail: &fail,
            page_cache: &self.options.page_cache,
        };
        if snap.txns_file.is_some() && snap.txns_file != self.state.read().txns_file {
            // A flush's new file of pending transactions: removed with the others on failure.
            (files.paths).extend(snap.txns_file.map(|id| self.dir.join(txn::file_name(id))));
        }
        let mut result = f(snap, &mut files);
        // Where the rows changed in memory so far went, found before taking the write lock
        // (reading keys); the switch looks up only rows changed after this.
        let mut moves = Moves::default();
        if let Ok(out) = &result {
            let pending = self.pending_moves(&self.state.read(), snap, out, carry, &moves);
            if let Err(e) = self.locate_moves(snap, out, pending, &mut moves) {
                result = Err(e);
            }
        }
        let mut state = self.state.write();
        // The ids handed out stay used: the metadata on disk may name them even after a failure.
        state.next_rowset_id = files.next_id;
        let next = result.and_then(|out| self.carry_over(&state, snap, out, carry, moves));
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                files.remove_all();
                state.thaw();
                return Err(e);
            }
        };
        let named: HashSet<&Path> = paths(&next.rowsets, &next.deltas).collect();
        let mut old_files: Vec<PathBuf> = paths(&state.rowsets, &state.deltas)
            .filter(|p| !named.contains(p))
            .map(Path::to_path_buf)
            .collect();
        if state.txns_file != snap.txns_file {
            old_files.extend(state.txns_file.map(|id| self.dir.join(txn::file_name(id))));
        }
        let written = self.write_metadata(&Metadata {
            position_base: state.position_base,
            requests: state.requests.persisted(durable_index),
            ..Metadata::of(
                schema,
                &next.rowsets,
                &next.deltas,
                state.next_rowset_id,
                durable_index,
                state.next_auto_id,
                snap.txns_file,
            )
        });
        if let Err(e) = written {
            state.thaw();
            return Err(e);
        }
        // Rowsets that keep their rows keep their DeltaMemStores (after a flush, the versions
        // written since it froze them); versions of rows that moved follow them.
        let mut deltas = next.deltas;
        for (d, origin) in deltas.iter_mut().zip(&next.origins) {
            if let Some(i) = origin {
                d.dms = std::mem::take(&mut state.deltas[*i].dms);
            }
        }
        let mut incoming: BTreeMap<usize, Vec<(u32, Versions)>> = BTreeMap::new();
        for (i, rows) in next.carried_rows {
            // The replaced rowset's store, taken whole: its rows in the order `rows` lists them.
            let old = std::mem::take(&mut state.deltas[i].dms.by_ordinal);
            for ((_, versions), (j, ordinal)) in old.into_iter().zip(rows) {
                incoming.entry(j).or_default().push((ordinal, versions));
            }
        }
        for (key, j, ordinal) in next.carried_keys {
            let versions = state.mrs.remove(&key);
            incoming.entry(j).or_default().push((ordinal, versions));
        }
        for (j, rows) in incoming {
            deltas[j].dms.add_rows(rows);
        }
        for (j, changed) in next.changed {
            deltas[j].dms.changed.extend(changed);
        }
        state.schema = Arc::new(schema.clone());
        state.tree = key_ranges(&next.rowsets);
        state.rowsets = next.rowsets;
        state.deltas = deltas;
        if let Carry::Flush = carry {
            state.frozen = None;
            state.frozen_keys_written.clear();
            // The images the flush wrote leave the arena.
            state.arena.drop_before(snap.arena.end());
        }
        state.durable_index = durable_index;
        state.last_applied = state.last_applied.max(durable_index);
        state.txns_file = snap.txns_file;
        drop(state);
        // The new state is durable; the replaced files are garbage now (open scans keep their
        // file handles or have read what they need). Removed once the tablet's writes and
        // scans no longer wait for the switch: removing a large file can take tens of
        // milliseconds.
        for path in old_files {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "could not remove a replaced file");
            }
        }
        Ok(())
    }

    /// The tablet's next rowsets (`out`, files written from `snap`) and where the changes
    /// writes made since `snap` go: a rowset with the same rows as one of `snap` takes its
    /// DeltaMemStore (after a flush, the versions written since the freeze); the changes of
    /// rows that moved to new rowsets (DeltaMemStore versions of replaced rowsets, and after a
    /// flush new MemRowSet versions of keys the flushed MemRowSet held) follow them by key
    /// (`moves` says where those found so far went).
    fn carry_over(
        &self,
        state: &State,
        snap: &Snapshot,
        out: Vec<Output>,
        carry: Carry,
        mut moves: Moves,
    ) -> Result<Next, StorageError> {
        let pending = self.pending_moves(state, snap, &out, carry, &moves);
        self.locate_moves(snap, &out, pending, &mut moves)?;
        let schema = &state.schema;
        let non_key: Vec<u32> = (0..schema.columns().len())
            .filter(|&c| !schema.is_key_column(c))
            .map(|c| c as u32)
            .collect();
        let mut carried_rows = Vec::new();
        let mut changed: BTreeMap<usize, BTreeSet<u32>> = BTreeMap::new();
        for &i in &replaced_rowsets(snap, &out) {
            let live = &state.deltas[i].dms;
            let mut rows = Vec::with_capacity(live.by_ordinal.len());
            let mut targets = BTreeSet::new();
            for &ordinal in live.by_ordinal.keys() {
                let Some(&Some((j, o))) = moves.rows.get(&(i, ordinal)) else {
                    return Err(StorageError::Corruption(
                        "a changed row is missing from rewritten rowsets".into(),
                    ));
                };
                rows.push((j, o));
                targets.insert(j);
            }
            for j in targets {
                changed.entry(j).or_default().extend(&live.changed);
            }
            if !rows.is_empty() {
                carried_rows.push((i, rows));
            }
        }
        // Keys of the flushed MemRowSet written meanwhile: their new versions follow the
        // rows into the new rowsets (unless deleted there).
        let mut carried_keys = Vec::new();
        if let Carry::Flush = carry {
            for key in &state.frozen_keys_written {
                if let Some(&Some((j, o))) = moves.keys.get(&key[..]) {
                    carried_keys.push((key.to_vec(), j, o));
                    changed.entry(j).or_default().extend(&non_key);
                }
            }
        }
        let origins = out.iter().map(|o| o.origin).collect();
        let (rowsets, deltas) = out.into_iter().map(|o| (o.rowset, o.deltas)).unzip();
        Ok(Next {
            rowsets,
            deltas,
            origins,
            carried_rows,
            carried_keys,
            changed,
        })
    }

    /// The rows changed in memory that moved to new rowsets and are not in `moves` yet: the
    /// ordinals of each replaced rowset with DeltaMemStore versions, and after a flush the
    /// flushed keys written since.
    fn pending_moves(
        &self,
        state: &State,
        snap: &Snapshot,
        out: &[Output],
        carry: Carry,
        moves: &Moves,
    ) -> PendingMoves {
        let rows = (replaced_rowsets(snap, out).into_iter())
            .map(|i| {
                let ordinals = state.deltas[i].dms.by_ordinal.keys();
                let new = ordinals.filter(|&&o| !moves.rows.contains_key(&(i, o)));
                (i, new.copied().collect::<Vec<u32>>())
            })
            .filter(|(_, ordinals)| !ordinals.is_empty())
            .collect();
        let keys = match carry {
            Carry::Flush => (state.frozen_keys_written.iter())
                .filter(|k| !moves.keys.contains_key(&k[..]))
                .map(|k| k.to_vec())
                .collect(),
            Carry::Compaction => Vec::new(),
        };
        (rows, keys)
    }

    /// Finds where the `pending` rows are live in the new rowsets of `out` (reading their
    /// keys from the snapshot's rowsets), into `moves`.
    fn locate_moves(
        &self,
        snap: &Snapshot,
        out: &[Output],
        (rows, keys): PendingMoves,
        moves: &mut Moves,
    ) -> Result<(), StorageError> {
        let cache = &self.options.page_cache;
        let find = |key: &[u8]| {
            let hash = crate::diskrowset::hash_bytes(key);
            for (j, o) in out.iter().enumerate().filter(|(_, o)| o.origin.is_none()) {
                if let Some(ordinal) = o.rowset.find(key, hash, cache)? {
                    if o.deltas.latest(ordinal) != Image::Absent {
                        return Ok(Some((j, ordinal)));
                    }
                }
            }
            Ok::<_, StorageError>(None)
        };
        for (i, ordinals) in rows {
            let found = snap.rowsets[i].read_key_rows(&ordinals)?;
            for (k, ordinal) in ordinals.into_iter().enumerate() {
                moves.rows.insert((i, ordinal), find(found.value(k))?);
            }
        }
        for key in keys {
            let target = find(&key)?;
            moves.keys.insert(key, target);
        }
        Ok(())
    }
}

/// What a flush, compaction or schema change works from: the tablet at its start.
pub(super) struct Snapshot {
    pub(super) schema: Arc<Schema>,
    pub(super) rowsets: Vec<Arc<DiskRowSet>>,
    pub(super) deltas: Vec<RowsetDeltas>,
    /// The MemRowSet a flush writes.
    pub(super) frozen: Option<Arc<MemRowSet>>,
    /// The arena's batches at the start.
    pub(super) arena: RowArena,
    pub(super) next_rowset_id: u64,
    pub(super) durable_index: u64,
    /// The file of pending transactions the new metadata names (a flush writes a new one).
    pub(super) txns_file: Option<u64>,
}

impl Snapshot {
    pub(super) fn of(state: &State) -> Snapshot {
        Snapshot {
            schema: state.schema.clone(),
            rowsets: state.rowsets.clone(),
            // Files, and a flush's frozen DeltaMemStores (not the live ones).
            deltas: (state.deltas.iter())
                .map(|d| {
                    let mut files = d.without_dms();
                    files.frozen = d.frozen.clone();
                    files
                })
                .collect(),
            frozen: state.frozen.clone(),
            arena: state.arena.clone(),
            next_rowset_id: state.next_rowset_id,
            durable_index: state.durable_index,
            txns_file: state.txns_file,
        }
    }
}

/// A rowset a rewrite produced: `origin` is the rowset of the snapshot with the same rows in
/// the same order, if there is one.
pub(super) struct Output {
    rowset: Arc<DiskRowSet>,
    deltas: RowsetDeltas,
    origin: Option<usize>,
}

impl Output {
    pub(super) fn same(rowset: Arc<DiskRowSet>, deltas: RowsetDeltas, origin: usize) -> Output {
        Output {
            rowset,
            deltas,
            origin: Some(origin),
        }
    }

    pub(super) fn new(new: history::NewRowset) -> Output {
        Output {
            rowset: new.rowset,
            deltas: new.deltas,
            origin: None,
        }
    }
}

/// How [`Tablet::carry_over`] treats the in-memory changes of a rewrite's rowsets.
#[derive(Clone, Copy)]
pub(super) enum Carry {
    /// The files hold the snapshot's DeltaMemStores and frozen MemRowSet.
    Flush,
    /// The files hold no in-memory changes.
    Compaction,
}

/// Where rows changed in memory went in a rewrite's new rowsets (None: nowhere live): rows of
/// replaced rowsets by (rowset, ordinal), flushed keys by key.
#[derive(Default)]
struct Moves {
    rows: HashMap<(usize, u32), Option<(usize, u32)>>,
    keys: KeyMap<Option<(usize, u32)>>,
}

/// Rows to find for [`Moves`]: ordinals by replaced rowset, and keys.
type PendingMoves = (Vec<(usize, Vec<u32>)>, Vec<Vec<u8>>);

/// The rowsets of `snap` whose rows a rewrite moved to new rowsets.
fn replaced_rowsets(snap: &Snapshot, out: &[Output]) -> Vec<usize> {
    (0..snap.rowsets.len())
        .filter(|&i| !out.iter().any(|o| o.origin == Some(i)))
        .collect()
}

/// The state a rewrite switches to (see [`Tablet::carry_over`]).
struct Next {
    rowsets: Vec<Arc<DiskRowSet>>,
    /// Their files (the DeltaMemStores are carried over at the switch).
    deltas: Vec<RowsetDeltas>,
    /// For each rowset, the rowset of the snapshot with the same rows, if any.
    origins: Vec<Option<usize>>,
    /// Rows of replaced rowsets with DeltaMemStore versions: for each such rowset, the rowset
    /// and ordinal each of its changed rows goes to, in ordinal order.
    carried_rows: Vec<(usize, Vec<(usize, u32)>)>,
    /// Keys whose MemRowSet versions go to a rowset's DeltaMemStore: key, rowset, ordinal.
    carried_keys: Vec<(Vec<u8>, usize, u32)>,
    /// The columns the carried versions may change, by rowset.
    changed: BTreeMap<usize, BTreeSet<u32>>,
}

/// The files of `rowsets` and of their `deltas`.
pub(super) fn paths<'a>(
    rowsets: &'a [Arc<DiskRowSet>],
    deltas: &'a [RowsetDeltas],
) -> impl Iterator<Item = &'a Path> {
    (rowsets.iter().flat_map(|r| r.paths()))
        .chain(deltas.iter().flat_map(|d| d.files().map(|f| f.path())))
}

impl State {
    /// Undoes a flush's freeze: the frozen MemRowSet's versions go back before the newer ones.
    pub(super) fn thaw(&mut self) {
        self.frozen_keys_written.clear();
        for d in &mut self.deltas {
            d.thaw();
        }
        if let Some(frozen) = self.frozen.take() {
            let newer = self.mrs.take();
            self.mrs = (*frozen).clone();
            self.mrs.append(newer);
        }
    }
}
