//! Maintenance scoring: which background operations on a tablet's files are worth their I/O.
//!
//! Each candidate gets a score comparable across operations and tablets (1 at the point where
//! it starts to pay), so that the engine's maintenance manager can run the best one of all its
//! tablets first and nothing below 1. Flushes are scored by memory use; compactions by what they
//! save later scans and lookups (REDO records to apply, expired UNDO bytes, overlapping rowsets
//! a key lookup must consult).

use std::sync::Arc;

use super::Tablet;
use crate::diskrowset::DiskRowSet;
use crate::rowset_tree::RowSetTree;

/// A background operation on a tablet's files, with the benefit it is expected to bring
/// (comparable across operations and tablets; below 1 it is not worth its I/O).
#[derive(Clone, Debug, PartialEq)]
pub struct MaintenanceOp {
    pub kind: MaintenanceKind,
    pub score: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MaintenanceKind {
    /// Merge a rowset's REDO files into one (minor delta compaction).
    MergeRedo { rowset: u64 },
    /// Rewrite a rowset with its REDO records applied to the base data (major delta
    /// compaction); older versions become UNDO records, expired history is dropped.
    ApplyRedo { rowset: u64 },
    /// Drop a rowset's UNDO records older than the history retention.
    TrimUndo { rowset: u64 },
    /// Merge rowsets whose key ranges overlap into non-overlapping ones (rowset compaction).
    MergeRowsets { rowsets: Vec<u64> },
}

impl MaintenanceKind {
    /// The kind's name, without the rowsets it is about (for metrics and the web UI).
    pub fn name(&self) -> &'static str {
        match self {
            MaintenanceKind::MergeRedo { .. } => "merge_redo",
            MaintenanceKind::ApplyRedo { .. } => "apply_redo",
            MaintenanceKind::TrimUndo { .. } => "trim_undo",
            MaintenanceKind::MergeRowsets { .. } => "merge_rowsets",
        }
    }
}

/// How many rowsets of alike size a queue tablet's merges wait for (see
/// [`Tablet::maintenance_ops`]); other tablets merge two.
const QUEUE_MERGE_FAN_IN: usize = 4;

impl Tablet {
    pub fn needs_flush(&self) -> bool {
        self.flush_score() >= 1.0
    }

    /// How full the in-memory data is: 1 at the flush threshold.
    pub fn flush_score(&self) -> f64 {
        self.memory_bytes() as f64 / self.options.flush_threshold_bytes.max(1) as f64
    }

    /// The background operations worth doing on this tablet's files now, best first.
    pub fn maintenance_ops(&self) -> Vec<MaintenanceOp> {
        let state = self.state.read();
        let ancient = self.ancient_history_mark();
        let mut ops = Vec::new();
        for (rowset, d) in state.rowsets.iter().zip(&state.deltas) {
            let id = rowset.id;
            // Major delta compaction pays when many rows have REDO records: each costs a scan
            // an extra image read and a skipped base row.
            let records = d.applicable_redo_records(ancient);
            let updated = records as f64 / rowset.num_rows().max(1) as f64;
            if updated >= 0.05 {
                ops.push(MaintenanceOp {
                    kind: MaintenanceKind::ApplyRedo { rowset: id },
                    score: 1.0 + updated * 10.0,
                });
            } else if d.redo.len() >= 2 {
                ops.push(MaintenanceOp {
                    kind: MaintenanceKind::MergeRedo { rowset: id },
                    score: (d.redo.len() - 1) as f64,
                });
            }
            let expired = d.undo.iter().filter(|u| u.meta.max_ts <= ancient);
            let expired_bytes: u64 = expired.map(|u| u.disk_bytes().max(1)).sum();
            if expired_bytes > 0 {
                ops.push(MaintenanceOp {
                    kind: MaintenanceKind::TrimUndo { rowset: id },
                    score: 1.0 + expired_bytes as f64 / rowset.disk_bytes().max(1) as f64,
                });
            }
        }
        // A queue's new rows need no lookup (their positions are new), so overlapping rowsets
        // cost its inserts nothing: a queue tablet merges four alike rowsets at a time, which
        // rewrites each row less often (log4 instead of log2 of its flushes).
        let fan_in = match state.schema.position_column() {
            Some(_) => QUEUE_MERGE_FAN_IN,
            None => 2,
        };
        if let Some(rowsets) = overlapping_rowsets(
            &state.rowsets,
            &state.tree,
            self.options.compaction_budget_bytes,
            fan_in,
        ) {
            ops.push(MaintenanceOp {
                score: (rowsets.len() - 1) as f64 / (fan_in - 1) as f64,
                kind: MaintenanceKind::MergeRowsets { rowsets },
            });
        }
        ops.sort_by(|a, b| b.score.total_cmp(&a.score));
        ops
    }
}

/// The rowsets to merge so that key lookups consult fewer rowsets: of those whose key ranges
/// cover one key, the most that are alike in size, smallest first within `budget` bytes; None
/// if fewer than two.
///
/// With a `fan_in` of 2, a rowset joins the smaller ones chosen before it only if it is at
/// most 1.5 times their total size (flushes of the same rows differ a little). Merging every
/// new flush into the big rowset it overlaps rewrote that rowset after each flush (a queue or
/// any workload of scattered keys); merging only rowsets of alike size rewrites a row about
/// log2(flushes) times, and leaves about as many rowsets at a key. With a larger `fan_in`, a
/// rowset joins only if it is at most 1.5 times the largest chosen: `fan_in` rowsets of one
/// size make one of the next, and a row is rewritten about log_fan_in(flushes) times.
fn overlapping_rowsets(
    rowsets: &[Arc<DiskRowSet>],
    tree: &RowSetTree,
    budget: u64,
    fan_in: usize,
) -> Option<Vec<u64>> {
    let size = |i: usize| rowsets[i].disk_bytes().max(1);
    let mut best: Vec<u64> = Vec::new();
    // The keys covered by most rowsets include the first key of some rowset.
    for (first, _) in rowsets.iter().filter_map(|r| r.key_bounds()) {
        let mut covering = tree.covering(first);
        if covering.len() <= best.len().max(1) {
            continue;
        }
        covering.sort_by_key(|&i| size(i));
        let (mut total, mut largest) = (0, 0);
        let alike: Vec<u64> = covering
            .into_iter()
            .take_while(|&i| {
                let like = match fan_in {
                    2 => total,
                    _ => largest,
                };
                let joins = total == 0 || (2 * size(i) <= 3 * like && total + size(i) <= budget);
                total += size(i);
                largest = size(i);
                joins
            })
            .map(|i| rowsets[i].id)
            .collect();
        if alike.len() > best.len() {
            best = alike;
        }
    }
    (best.len() >= 2).then_some(best)
}
