//! Column files: new base data for some of a rowset's columns, so that a major delta
//! compaction of an update-heavy rowset rewrites only the columns its updates changed.
//!
//! A column file holds the same rows in the same order and row groups of the same sizes as the
//! rowset's file (checked when it is written and opened), so ordinals, row selections and page
//! statistics carry over unchanged. A column is read from the newest file that holds it; a new
//! column file drops older ones whose every column it replaces, and the tablet bounds how many a
//! rowset may have before a compaction rewrites the whole rowset.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use serde::{Deserialize, Serialize};

use super::{check_columns, load_metadata, row_groups, write_columns, DiskRowSet};
use crate::{Schema, StorageError};

/// What the tablet metadata records of a column file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ColumnFileMeta {
    pub id: u64,
    /// The table columns (positions) the file holds, ascending.
    pub columns: Vec<u32>,
    pub checksum: u32,
}

/// New base data for some columns of a rowset, written by a major delta compaction that
/// rewrote only the columns its REDO records changed: the same rows in the same order, in row
/// groups of the same sizes.
pub struct ColumnFile {
    pub meta: ColumnFileMeta,
    pub(super) path: PathBuf,
    bytes: u64,
    pub(super) metadata: ArrowReaderMetadata,
    /// The id of the file's data pages in the page cache.
    pub(super) cache_id: u64,
}

impl ColumnFile {
    pub fn file_name(id: u64) -> String {
        format!("columns-{id:010}.parquet")
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn disk_bytes(&self) -> u64 {
        self.bytes
    }

    /// Opens the column file `meta` describes, of a table with schema `table`, checking its
    /// checksum and that it holds the columns `meta` says.
    pub(super) fn open(
        dir: &Path,
        meta: ColumnFileMeta,
        table: &Schema,
    ) -> Result<ColumnFile, StorageError> {
        let path = dir.join(Self::file_name(meta.id));
        crate::checksum::verify(&path, meta.checksum)?;
        let file = File::open(&path).map_err(StorageError::on(&path))?;
        let metadata = load_metadata(&path, &file)?;
        let columns: Vec<usize> = meta.columns.iter().map(|&c| c as usize).collect();
        let expected = table.arrow_schema().project(&columns).map_err(|_| {
            StorageError::Corruption(format!("{}: no such columns", path.display()))
        })?;
        check_columns(&path, &metadata, &expected)?;
        Ok(ColumnFile {
            bytes: file.metadata()?.len(),
            metadata,
            meta,
            path,
            cache_id: crate::cache::next_index_id(),
        })
    }
}

impl DiskRowSet {
    /// Writes new base data for the table columns `columns` (ascending) of this rowset as
    /// column file `id` in `dir`, synced: `batches` hold those columns of every row in order.
    pub fn write_columns(
        &self,
        dir: &Path,
        id: u64,
        table: &Schema,
        columns: &[u32],
        batches: &[RecordBatch],
    ) -> Result<ColumnFile, StorageError> {
        let path = dir.join(ColumnFile::file_name(id));
        let positions: Vec<usize> = columns.iter().map(|&c| c as usize).collect();
        let checksum = write_columns(&path, table, &positions, batches)?;
        let meta = ColumnFileMeta {
            id,
            columns: columns.to_vec(),
            checksum,
        };
        let file = ColumnFile::open(dir, meta, table)?;
        if row_groups(&file.metadata) != row_groups(&self.metadata) {
            return Err(StorageError::Corruption(format!(
                "{}: row groups differ from the rowset's",
                file.path.display()
            )));
        }
        Ok(file)
    }

    /// This rowset with `file` as the newest base data of its columns. Older column files
    /// whose every column it replaces are left out.
    pub fn with_column_file(&self, file: ColumnFile) -> DiskRowSet {
        let mut column_files: Vec<Arc<ColumnFile>> = self
            .column_files
            .iter()
            .filter(|f| {
                f.meta
                    .columns
                    .iter()
                    .any(|c| !file.meta.columns.contains(c))
            })
            .cloned()
            .collect();
        column_files.push(Arc::new(file));
        DiskRowSet {
            id: self.id,
            path: self.path.clone(),
            key_columns: self.key_columns.clone(),
            keys: self.keys.clone(),
            column_files,
            bytes: self.bytes,
            metadata: self.metadata.clone(),
            cache_id: self.cache_id,
            checksum: self.checksum,
            ranges: Default::default(),
            written: self.written.clone(),
        }
    }

    pub fn column_files(&self) -> &[Arc<ColumnFile>] {
        &self.column_files
    }

    /// Where table column `c` is read: the newest column file holding it (None: the rowset's
    /// file) and its index there.
    pub(super) fn source(&self, c: usize) -> (Option<&ColumnFile>, usize) {
        for file in self.column_files.iter().rev() {
            if let Some(i) = file.meta.columns.iter().position(|&x| x as usize == c) {
                return (Some(file), i);
            }
        }
        (None, c)
    }

    /// The path and metadata of the file holding column `c`.
    pub(super) fn file_of(&self, c: usize) -> (&Path, &ArrowReaderMetadata) {
        match self.source(c).0 {
            Some(f) => (&f.path, &f.metadata),
            None => (&self.path, &self.metadata),
        }
    }

    /// `columns` (indexes into the table schema) grouped by the file holding them.
    pub(super) fn by_file(&self, columns: &[usize]) -> Vec<FileColumns<'_>> {
        let mut groups: Vec<(Option<u64>, FileColumns)> = Vec::new();
        for (i, &c) in columns.iter().enumerate() {
            let (file, root) = self.source(c);
            let id = file.map(|f| f.meta.id);
            match groups.iter_mut().find(|g| g.0 == id) {
                Some(g) => g.1.columns.push((i, root)),
                None => {
                    let (path, metadata) = self.file_of(c);
                    let columns = vec![(i, root)];
                    groups.push((
                        id,
                        FileColumns {
                            path,
                            metadata,
                            cache_id: file.map_or(self.cache_id, |f| f.cache_id),
                            columns,
                        },
                    ));
                }
            }
        }
        let mut groups: Vec<FileColumns> = groups.into_iter().map(|g| g.1).collect();
        for g in &mut groups {
            // Parquet returns the projected columns in file order.
            g.columns.sort_by_key(|c| c.1);
        }
        groups
    }
}

/// Some columns of a read, all in one file of a rowset.
pub(super) struct FileColumns<'a> {
    pub(super) path: &'a Path,
    pub(super) metadata: &'a ArrowReaderMetadata,
    /// The id of the file's data pages in the page cache.
    pub(super) cache_id: u64,
    /// For each column: its index in the columns read, and in the file; in file order.
    pub(super) columns: Vec<(usize, usize)>,
}
