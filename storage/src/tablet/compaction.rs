//! What a flush and each compaction write (Kudu's flush, minor and major delta compactions, UNDO
//! garbage collection and rowset compaction); [`Tablet::rewrite`] switches to it.
//!
//! A flush writes the frozen MemRowSet as new rowsets (each key's newest image as base data, its
//! older versions as UNDO records) and each frozen DeltaMemStore as a new REDO file of its rowset,
//! whose base data stays as it is. Compactions keep the rows but change how they are stored: merge
//! REDO files, drop expired UNDO files, apply REDO records to the base data (all columns, or as a
//! column file of only the changed ones), or merge overlapping rowsets into non-overlapping ones.
//! Each is an equivalent rewrite: a scan at any snapshot still allowed sees the same rows before
//! and after.

use std::sync::Arc;

use arrow::array::RecordBatch;

use super::rewrite::{Carry, Output, Snapshot};
use super::{txn, MaintenanceKind, Tablet};
use crate::delta::{Layout, RowsetDeltas};
use crate::history::{self, Chain};
use crate::{StorageError, Timestamp};

impl Tablet {
    /// Writes in-memory rows and deltas to new files and switches to them atomically. Writes
    /// go on meanwhile (see [`Tablet::rewrite`]).
    pub fn flush(&self) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        self.flush_rewriting()
    }

    /// [`Tablet::flush`], with `rewriting` held.
    pub(super) fn flush_rewriting(&self) -> Result<(), StorageError> {
        let (mut snapshot, durable, pending) = {
            let mut state = self.state.write();
            let durable = state.last_applied;
            let dirty = !state.mrs.is_empty() || state.deltas.iter().any(|d| !d.dms.is_empty());
            if !dirty && state.durable_index == durable {
                return Ok(());
            }
            // Transactions pending now have log entries at or before `durable`: the files
            // must hold their writes too, in a file of their own.
            let pending = state.has_pending().then(|| {
                state.next_rowset_id += 1;
                let id = state.next_rowset_id - 1;
                (id, state.txns.clone(), state.turns.clone())
            });
            // Writes from now on go to a new MemRowSet and new DeltaMemStores; these are
            // written out.
            let frozen = state.mrs.take();
            state.frozen = Some(Arc::new(frozen));
            for d in state.deltas.iter_mut().filter(|d| !d.dms.is_empty()) {
                d.frozen = Some(Arc::new(std::mem::take(&mut d.dms)));
            }
            (Snapshot::of(&state), durable, pending)
        };
        snapshot.txns_file = None;
        if let Some((id, txns, turns)) = pending {
            let path = self.dir.join(txn::file_name(id));
            if let Err(e) = txn::write_file(&path, &txns, &turns) {
                let _ = std::fs::remove_file(&path);
                self.state.write().thaw();
                return Err(e);
            }
            snapshot.txns_file = Some(id);
        }
        let ancient = self.ancient_history_mark();
        let schema = snapshot.schema.clone();
        self.rewrite(&snapshot, &schema, durable, Carry::Flush, |snap, files| {
            let table = schema.arrow_schema();
            let mut out = Vec::with_capacity(snap.rowsets.len());
            // Each DeltaMemStore becomes a REDO file of its rowset.
            for (i, (rowset, d)) in snap.rowsets.iter().zip(&snap.deltas).enumerate() {
                let mut flushed = d.without_dms();
                if let Some(frozen) = &d.frozen {
                    let (records, images) = d.frozen_records(rowset, &table, &snap.arena)?;
                    let layout = Layout {
                        columns: None,
                        changed: Some(frozen.changed.iter().copied().collect()),
                    };
                    flushed.add_redo(files.delta(&schema, layout, &[&images], &records)?)?;
                }
                out.push(Output::same(rowset.clone(), flushed, i));
            }
            // The MemRowSet: every key's versions, in key order, rolled at the target size.
            let Some(frozen) = &snap.frozen else {
                return Ok(out);
            };
            let sources: Vec<&RecordBatch> = snap.arena.batches().iter().collect();
            let chains = frozen.index.iter().map(|(key, versions)| Chain {
                key: key.to_vec(),
                versions: versions
                    .iter()
                    .map(|v| (v.ts, v.row.map(|r| snap.arena.index(r))))
                    .collect(),
            });
            let bytes = snap.arena.bytes() as u64;
            let rows_per_rowset = self.rows_per_rowset(bytes, frozen.len());
            for new in
                history::write_chains(files, &schema, &sources, chains, ancient, rows_per_rowset)?
            {
                out.push(Output::new(new));
            }
            Ok(out)
        })
    }
    /// Rows per rowset for a rewrite of rowsets that take `bytes` on disk for `rows` rows.
    fn rows_per_rowset(&self, bytes: u64, rows: usize) -> usize {
        let per_row = (bytes as usize / rows.max(1)).max(1);
        (self.options.rowset_target_bytes / per_row).max(1024)
    }

    /// Runs one maintenance operation (see [`MaintenanceKind`]). Rowsets with changes in
    /// memory are flushed first; changes writes make meanwhile are carried over to the new
    /// files. An operation whose rowsets are gone already does nothing.
    pub fn compact(&self, kind: &MaintenanceKind) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        let ids: Vec<u64> = match kind {
            MaintenanceKind::MergeRedo { rowset }
            | MaintenanceKind::ApplyRedo { rowset }
            | MaintenanceKind::TrimUndo { rowset } => vec![*rowset],
            MaintenanceKind::MergeRowsets { rowsets } => rowsets.clone(),
        };
        let in_memory = {
            let state = self.state.read();
            (state.rowsets.iter().zip(&state.deltas))
                .any(|(r, d)| ids.contains(&r.id) && !d.dms.is_empty())
        };
        if in_memory {
            self.flush_rewriting()?;
        }
        let snapshot = Snapshot::of(&self.state.read());
        let mut indexes = Vec::new();
        for id in &ids {
            match snapshot.rowsets.iter().position(|r| r.id == *id) {
                Some(i) => indexes.push(i),
                None => return Ok(()),
            }
        }
        indexes.sort_unstable();
        if matches!(kind, MaintenanceKind::ApplyRedo { .. })
            && snapshot.deltas[indexes[0]].redo.is_empty()
        {
            return Ok(());
        }
        let ancient = self.ancient_history_mark();
        let schema = snapshot.schema.clone();
        let width = schema.columns().len();
        // A major delta compaction rewrites only the columns that REDO records change, unless
        // that is every column, the rowset has many column or UNDO files already, or its files
        // hold the columns of an older schema (its column files would hold the table's).
        let changed = match kind {
            MaintenanceKind::ApplyRedo { .. } => {
                let few = |n: usize| n < self.options.max_column_files;
                let i = indexes[0];
                snapshot.deltas[i]
                    .changed_columns()
                    .filter(|c| !c.is_empty() && c.len() < width - schema.key_columns().len())
                    .filter(|_| {
                        !snapshot.rowsets[i].is_written_under_older_schema()
                            && few(snapshot.rowsets[i].column_files().len())
                            && few(snapshot.deltas[i].undo.len().saturating_sub(1))
                    })
            }
            _ => None,
        };
        self.compactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let durable = snapshot.durable_index;
        self.rewrite(
            &snapshot,
            &schema,
            durable,
            Carry::Compaction,
            |snap, files| {
                let mut out: Vec<Output> = (snap.rowsets.iter().zip(&snap.deltas).enumerate())
                    .filter(|(i, _)| !indexes.contains(i))
                    .map(|(i, (r, d))| Output::same(r.clone(), d.clone(), i))
                    .collect();
                let all: Vec<usize> = (0..width).collect();
                let i = indexes[0];
                let (rowset, d) = (&snap.rowsets[i], &snap.deltas[i]);
                match kind {
                    MaintenanceKind::MergeRedo { .. } => {
                        let mut images = Vec::new();
                        let mut records = Vec::new();
                        for file in &d.redo {
                            let read = file.read(&all)?;
                            for (row, (&ordinal, &ts)) in
                                read.ordinals.iter().zip(&read.ts).enumerate()
                            {
                                let image =
                                    (!read.deleted.value(row)).then_some((images.len(), row));
                                records.push(crate::delta::Record {
                                    ordinal,
                                    ts: Timestamp(ts),
                                    image,
                                });
                            }
                            images.push(read.images);
                        }
                        // Files are in time order and each is sorted: a stable sort by ordinal keeps
                        // every ordinal's records in time order.
                        records.sort_by_key(|r| r.ordinal);
                        let refs: Vec<&RecordBatch> = images.iter().collect();
                        let layout = Layout {
                            columns: None,
                            changed: d.changed_columns().map(|c| c.into_iter().collect()),
                        };
                        let merged = files.delta(&schema, layout, &refs, &records)?;
                        let merged = RowsetDeltas::new(d.undo.clone(), vec![merged])?;
                        out.push(Output::same(rowset.clone(), merged, i));
                    }
                    MaintenanceKind::TrimUndo { .. } => {
                        let kept = d.undo.iter().filter(|u| u.meta.max_ts > ancient);
                        let trimmed = RowsetDeltas::new(kept.cloned().collect(), d.redo.clone())?;
                        out.push(Output::same(rowset.clone(), trimmed, i));
                    }
                    MaintenanceKind::ApplyRedo { .. } if changed.is_some() => {
                        let columns: Vec<u32> = changed.iter().flatten().copied().collect();
                        let new = history::apply_redo_to_columns(
                            files, &schema, rowset, d, &columns, ancient,
                        )?;
                        out.push(Output::same(new.rowset, new.deltas, i));
                    }
                    MaintenanceKind::ApplyRedo { .. } | MaintenanceKind::MergeRowsets { .. } => {
                        let mut images = Vec::new();
                        let mut parts = Vec::new();
                        let (mut bytes, mut rows) = (0, 0);
                        for &i in &indexes {
                            let rowset = &snap.rowsets[i];
                            parts.push(history::rowset_chains(
                                rowset,
                                &snap.deltas[i],
                                width,
                                &mut images,
                            )?);
                            bytes += rowset.disk_bytes();
                            rows += rowset.num_rows();
                        }
                        let chains = history::merge_chains(parts, ancient);
                        let refs: Vec<&RecordBatch> = images.iter().collect();
                        let per_rowset = self.rows_per_rowset(bytes, rows);
                        for new in history::write_chains(
                            files, &schema, &refs, chains, ancient, per_rowset,
                        )? {
                            out.push(Output::new(new));
                        }
                    }
                }
                Ok(out)
            },
        )
    }
}
