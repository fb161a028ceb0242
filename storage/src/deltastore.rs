//! Delta stores: changes to rows that already live in a DiskRowSet.
//!
//! DiskRowSet base data is immutable, so an UPDATE, UPSERT or DELETE of a flushed row is recorded
//! in the rowset's `DeltaMemStore`, keyed by the row's ordinal in the rowset: versions of the new
//! full row image (held in the tablet's row arena) or a deletion mark. A scan hides base rows
//! that have a delta visible at its snapshot and adds the visible new images instead. On flush
//! a rowset with deltas is rewritten with its deltas applied (a major delta compaction), so the
//! deltas never need their own file format yet; separate delta files and UNDO history come with
//! the storage issue.

use std::collections::BTreeMap;

use crate::memrowset::{visible, RowRef, Version};
use crate::Timestamp;

#[derive(Default, Clone)]
pub struct DeltaMemStore {
    pub by_ordinal: BTreeMap<u32, Vec<Version>>,
}

impl DeltaMemStore {
    pub fn latest(&self, ordinal: u32) -> Option<&Version> {
        self.by_ordinal.get(&ordinal).and_then(|v| v.last())
    }

    pub fn push(&mut self, ordinal: u32, version: Version) {
        self.by_ordinal.entry(ordinal).or_default().push(version);
    }

    pub fn is_empty(&self) -> bool {
        self.by_ordinal.is_empty()
    }

    /// At `snapshot`: ordinals whose base row is replaced or deleted, and the replacing rows.
    pub fn view(&self, snapshot: Timestamp) -> (Vec<u32>, Vec<RowRef>) {
        let mut hidden = Vec::new();
        let mut rows = Vec::new();
        for (&ordinal, versions) in &self.by_ordinal {
            if let Some(v) = visible(versions, snapshot) {
                hidden.push(ordinal);
                rows.extend(v.row);
            }
        }
        (hidden, rows)
    }
}
