//! The DeltaMemStore: REDO records of a rowset's rows not yet flushed, kept as versions (images
//! in the tablet's row arena) keyed by ordinal.
//!
//! While a flush writes a store, it is frozen (still read) and a new one takes the writes;
//! every version of the frozen store is older than every version of the new one, so a row's
//! versions in memory are the frozen ones followed by the live ones. A failed flush thaws the
//! frozen store back in front of the live one.

use std::collections::{BTreeMap, BTreeSet};

use super::RowsetDeltas;
use crate::memrowset::{Version, Versions};

/// Changes recorded since the last flush: versions of rows of one rowset, by ordinal.
#[derive(Default, Clone)]
pub struct DeltaMemStore {
    pub by_ordinal: BTreeMap<u32, Versions>,
    /// The table columns the versions may change (see
    /// [`DeltaMeta::changed`](super::DeltaMeta::changed)).
    pub changed: BTreeSet<u32>,
    /// How many versions are deletions.
    deletions: usize,
}

impl DeltaMemStore {
    pub fn is_empty(&self) -> bool {
        self.by_ordinal.is_empty()
    }

    pub fn push(&mut self, ordinal: u32, version: Version) {
        self.deletions += usize::from(version.row.is_none());
        self.by_ordinal.entry(ordinal).or_default().push(version);
    }

    /// Adds the versions of rows this store has none of yet (each row once).
    pub fn add_rows(&mut self, mut rows: Vec<(u32, Versions)>) {
        let deletions = rows.iter().flat_map(|r| &r.1).filter(|v| v.row.is_none());
        self.deletions += deletions.count();
        rows.sort_unstable_by_key(|r| r.0);
        match self.by_ordinal.is_empty() {
            // Built at once from sorted rows.
            true => self.by_ordinal = rows.into_iter().collect(),
            false => self.by_ordinal.extend(rows),
        }
    }

    /// Whether a scan of `columns` sees nothing of this store: it deletes no row and changes
    /// none of the columns.
    pub(super) fn invisible_to(&self, columns: &[usize]) -> bool {
        self.deletions == 0 && !columns.iter().any(|&c| self.changed.contains(&(c as u32)))
    }
}

impl RowsetDeltas {
    /// The DeltaMemStore versions of `ordinal`, oldest first.
    pub(super) fn dms_versions(&self, ordinal: u32) -> std::borrow::Cow<'_, [Version]> {
        let live = self
            .dms
            .by_ordinal
            .get(&ordinal)
            .map_or(&[][..], Versions::as_slice);
        let frozen = (self.frozen.as_ref()).and_then(|f| f.by_ordinal.get(&ordinal));
        match frozen {
            None => live.into(),
            Some(older) if live.is_empty() => older.as_slice().into(),
            Some(older) => [older.as_slice(), live].concat().into(),
        }
    }

    /// Every ordinal with DeltaMemStore versions, with its versions, in ordinal order.
    pub(super) fn dms_entries(&self) -> std::borrow::Cow<'_, BTreeMap<u32, Versions>> {
        let Some(frozen) = &self.frozen else {
            return std::borrow::Cow::Borrowed(&self.dms.by_ordinal);
        };
        let mut all = frozen.by_ordinal.clone();
        for (ordinal, versions) in &self.dms.by_ordinal {
            all.entry(*ordinal).or_default().extend_from_slice(versions);
        }
        std::borrow::Cow::Owned(all)
    }

    /// Undoes a flush's freeze: the frozen store's versions go back before the newer ones.
    pub fn thaw(&mut self) {
        if let Some(frozen) = self.frozen.take() {
            let newer = std::mem::replace(&mut self.dms, (*frozen).clone());
            for (ordinal, versions) in newer.by_ordinal {
                for version in versions {
                    self.dms.push(ordinal, version);
                }
            }
            self.dms.changed.extend(newer.changed);
        }
    }
}
