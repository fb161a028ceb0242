//! A backup's manifest: what the backup holds, written last so that a directory without one
//! never passes for a backup.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use nyala_engine::{PartitionSchema, TableId};
use nyala_storage::{Schema, Timestamp};
use serde::{Deserialize, Serialize};

use crate::{Result, SqlError};

/// The manifest's file name in a backup's directory.
pub(crate) const MANIFEST: &str = "manifest.json";
/// What [`Manifest::format`] says.
const FORMAT: &str = "nyala-backup";
/// The manifest layout this code writes and reads.
const VERSION: u32 = 1;
/// Incremental backups a restore follows back to a full one, at most.
const MAX_CHAIN: usize = 1000;

/// What a backup holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub format: String,
    pub version: u32,
    /// The snapshot every table was read at (hybrid time), and the same as text.
    pub snapshot: Timestamp,
    pub snapshot_time: String,
    /// An incremental backup's parent: the backup whose snapshot its changes start after.
    pub parent: Option<Parent>,
    pub tables: Vec<TableBackup>,
    /// The views (a `BACKUP DATABASE`'s; none in a backup of tables).
    pub views: Vec<ViewBackup>,
}

/// Where an incremental backup's parent is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Parent {
    /// Its directory, as an absolute path.
    pub path: PathBuf,
    pub snapshot: Timestamp,
}

/// One table of a backup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TableBackup {
    pub name: String,
    /// The table's catalog id: an incremental backup continues its parent's only for the same
    /// table (not one dropped and created again under its name).
    pub id: TableId,
    pub schema: Schema,
    pub partition: PartitionSchema,
    pub replicas: usize,
    /// One Parquet file per tablet: its rows at the snapshot (a full backup), or the rows whose
    /// keys changed since the parent's snapshot with their `_change` (an incremental one).
    pub files: Vec<BackupFile>,
}

/// A data file of a backup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BackupFile {
    /// Relative to the backup's directory.
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    pub crc32: u32,
}

/// A view of a backup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ViewBackup {
    pub name: String,
    pub sql: String,
}

impl Manifest {
    pub(crate) fn new(snapshot: Timestamp, parent: Option<Parent>) -> Self {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            snapshot,
            snapshot_time: snapshot.display(),
            parent,
            tables: Vec::new(),
            views: Vec::new(),
        }
    }

    pub(crate) fn table(&self, name: &str) -> Option<&TableBackup> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The manifest of the backup in `dir`, or an error saying why there is none.
    pub(crate) fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SqlError::Invalid(format!(
                    "{} holds no complete backup (it has no {MANIFEST})",
                    dir.display()
                )))
            }
            Err(e) => return Err(io_error(&path, "read", e)),
        };
        let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| {
            SqlError::Invalid(format!("{} is not a backup manifest: {e}", path.display()))
        })?;
        if manifest.format != FORMAT || manifest.version != VERSION {
            return Err(SqlError::Invalid(format!(
                "{} is a manifest of format {} version {}; this server reads {FORMAT} version \
                 {VERSION}",
                path.display(),
                manifest.format,
                manifest.version
            )));
        }
        Ok(manifest)
    }

    /// Writes the manifest into `dir` atomically (a temporary file synced, then renamed), after
    /// the files it lists are durable.
    pub(crate) fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(MANIFEST);
        let temporary = dir.join(format!(".{MANIFEST}.tmp"));
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| SqlError::Invalid(format!("cannot encode the manifest: {e}")))?;
        let mut file = File::create(&temporary).map_err(|e| io_error(&temporary, "create", e))?;
        file.write_all(&text)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_error(&temporary, "write", e))?;
        std::fs::rename(&temporary, &path).map_err(|e| io_error(&path, "create", e))?;
        sync_dir(dir)?;
        Ok(path)
    }

    /// The backups a restore of the one in `dir` applies, oldest (the full one) first.
    pub(crate) fn chain(dir: &Path) -> Result<Vec<(PathBuf, Manifest)>> {
        let mut chain = vec![(dir.to_path_buf(), Manifest::read(dir)?)];
        while let Some((child, parent)) = (chain.last())
            .and_then(|(path, m)| m.parent.clone().map(|p| (path.display().to_string(), p)))
        {
            if chain.len() > MAX_CHAIN {
                return Err(SqlError::Invalid(format!(
                    "{} is more than {MAX_CHAIN} incremental backups away from a full one",
                    dir.display()
                )));
            }
            let manifest = Manifest::read(&parent.path)
                .map_err(|e| SqlError::Invalid(format!("the parent of {child} is missing: {e}")))?;
            if manifest.snapshot != parent.snapshot {
                return Err(SqlError::Invalid(format!(
                    "{} holds a backup taken at {}, not the parent taken at {} that {child} \
                     continues",
                    parent.path.display(),
                    manifest.snapshot_time,
                    parent.snapshot.display(),
                )));
            }
            chain.push((parent.path, manifest));
        }
        chain.reverse();
        Ok(chain)
    }
}

impl BackupFile {
    /// Checks that the file in `dir` has the size and checksum the manifest gives it.
    pub(crate) fn verify(&self, dir: &Path) -> Result<()> {
        let path = dir.join(&self.path);
        let file = File::open(&path).map_err(|e| io_error(&path, "open", e))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut hasher = crc32fast::Hasher::new();
        let mut bytes = 0u64;
        let mut buffer = vec![0; 1 << 20];
        loop {
            let n = reader
                .read(&mut buffer)
                .map_err(|e| io_error(&path, "read", e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            bytes += n as u64;
        }
        match (bytes, hasher.finalize()) {
            (b, crc) if b == self.bytes && crc == self.crc32 => Ok(()),
            (b, _) => Err(SqlError::Invalid(format!(
                "{} is damaged: {b} bytes that do not match the {} bytes and checksum its \
                 backup's {MANIFEST} gives",
                path.display(),
                self.bytes
            ))),
        }
    }
}

/// A file writer that counts and checksums what goes through it.
pub(crate) struct Checksummed<W> {
    pub inner: W,
    pub bytes: u64,
    pub crc: crc32fast::Hasher,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Makes the entries of directory `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, "sync", e))
}

/// An I/O error, naming the path and what was being done.
pub(crate) fn io_error(path: &Path, doing: &str, e: std::io::Error) -> SqlError {
    SqlError::Invalid(format!("cannot {doing} {}: {e}", path.display()))
}
