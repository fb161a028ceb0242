//! The tablet metadata: the one file that says which files make up the tablet.
//!
//! Every change to the set of files (a flush, a compaction, a schema change) writes new files
//! first and then replaces this file atomically (temp file, fsync, rename, fsync of the
//! directory), so after a crash the tablet is either wholly before or wholly after the change;
//! files it does not name are leftovers and are deleted on open. `durable_index` is the last log
//! entry whose effects the named files hold. The JSON follows a CRC32 line, so that a damaged
//! file is reported as such; fields added later have serde defaults, so that older metadata
//! still opens.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Tablet;
use crate::delta::{DeltaMeta, RowsetDeltas};
use crate::diskrowset::{ColumnFileMeta, DiskRowSet};
use crate::{Schema, StorageError};

#[derive(Serialize, Deserialize)]
pub(super) struct Metadata {
    pub(super) schema: Schema,
    pub(super) rowsets: Vec<u64>,
    /// The delta files of rowsets that have any, by rowset id.
    #[serde(default)]
    pub(super) deltas: BTreeMap<u64, DeltaFiles>,
    /// CRC32 of each rowset's file, by rowset id.
    #[serde(default)]
    pub(super) checksums: BTreeMap<u64, u32>,
    /// The column files of rowsets that have any, oldest first, by rowset id.
    #[serde(default)]
    pub(super) column_files: BTreeMap<u64, Vec<ColumnFileMeta>>,
    /// The ids of the columns that rowsets written under an older schema hold (with their
    /// column files), by rowset id (see [`crate::column_map`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) rowset_columns: BTreeMap<u64, Vec<u32>>,
    pub(super) next_rowset_id: u64,
    pub(super) durable_index: u64,
    /// Above every auto_incrementing_id written so far.
    #[serde(default)]
    pub(super) next_auto_id: i64,
    /// The file with the transactions pending as of `durable_index` (`txns-<id>`), if any.
    #[serde(default)]
    pub(super) txns_file: Option<u64>,
    /// Added to every queue position this tablet assigns: above the positions of the rows a
    /// clone starts with (see [`super::State::entry_position`]).
    #[serde(default)]
    pub(super) position_base: u64,
    /// The clients' requests applied by entries up to `durable_index`, lately (see
    /// `requests.rs`).
    #[serde(default)]
    pub(super) requests: Vec<super::requests::Applied>,
}

impl Metadata {
    /// The metadata naming `rowsets` with their files (`deltas` parallel to them).
    pub(super) fn of(
        schema: &Schema,
        rowsets: &[Arc<DiskRowSet>],
        deltas: &[RowsetDeltas],
        next_rowset_id: u64,
        durable_index: u64,
        next_auto_id: i64,
        txns_file: Option<u64>,
    ) -> Metadata {
        Metadata {
            schema: schema.clone(),
            rowsets: rowsets.iter().map(|r| r.id).collect(),
            checksums: (rowsets.iter())
                .filter_map(|r| Some((r.id, r.checksum?)))
                .collect(),
            column_files: (rowsets.iter())
                .filter(|r| !r.column_files().is_empty())
                .map(|r| {
                    let files = r.column_files().iter().map(|f| f.meta.clone());
                    (r.id, files.collect())
                })
                .collect(),
            rowset_columns: (rowsets.iter())
                .filter(|r| r.is_written_under_older_schema())
                .map(|r| (r.id, r.column_ids(schema)))
                .collect(),
            deltas: (rowsets.iter().zip(deltas))
                .filter(|(_, d)| d.files().next().is_some())
                .map(|(r, d)| {
                    let undo = d.undo.iter().map(|f| f.meta.clone()).collect();
                    let redo = d.redo.iter().map(|f| f.meta.clone()).collect();
                    (r.id, DeltaFiles { undo, redo })
                })
                .collect(),
            next_rowset_id,
            durable_index,
            next_auto_id,
            txns_file,
            position_base: 0,
            requests: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Default)]
pub(super) struct DeltaFiles {
    /// Oldest first (metadata written before there could be several holds one or null).
    #[serde(deserialize_with = "one_or_more")]
    pub(super) undo: Vec<DeltaMeta>,
    pub(super) redo: Vec<DeltaMeta>,
}

fn one_or_more<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<DeltaMeta>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMore {
        More(Vec<DeltaMeta>),
        One(Option<DeltaMeta>),
    }
    Ok(match OneOrMore::deserialize(d)? {
        OneOrMore::More(files) => files,
        OneOrMore::One(file) => file.into_iter().collect(),
    })
}

pub(super) const METADATA: &str = "metadata";

impl Tablet {
    pub(super) fn write_metadata(&self, meta: &Metadata) -> Result<(), StorageError> {
        write_metadata(&self.dir, meta, &|step| self.fail(step))
    }
}

/// Writes the metadata: a temp file, synced, renamed over the old one, directory synced.
pub(super) fn write_metadata(
    dir: &Path,
    meta: &Metadata,
    fail: &dyn Fn(&str) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let json = serde_json::to_vec(meta).map_err(|e| StorageError::Corruption(e.to_string()))?;
    let tmp = dir.join("metadata.tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(format!("{:08x}\n", crc32fast::hash(&json)).as_bytes())?;
    file.write_all(&json)?;
    file.sync_all()?;
    fail("metadata_staged")?;
    std::fs::rename(&tmp, dir.join(METADATA))?;
    File::open(dir)?.sync_all()?;
    fail("metadata_switched")
}

pub(super) fn read_metadata(dir: &Path) -> Result<Metadata, StorageError> {
    let path = dir.join(METADATA);
    let bytes = std::fs::read(&path).map_err(StorageError::on(&path))?;
    let bad = || StorageError::Corruption(format!("{} is damaged", path.display()));
    let (crc, json) = bytes.split_at_checked(9).ok_or_else(bad)?;
    let crc = std::str::from_utf8(&crc[..8])
        .ok()
        .and_then(|s| u32::from_str_radix(s, 16).ok())
        .ok_or_else(bad)?;
    if crc32fast::hash(json) != crc {
        return Err(bad());
    }
    serde_json::from_slice(json)
        .map_err(|e| StorageError::Corruption(format!("{} is damaged: {e}", path.display())))
}
