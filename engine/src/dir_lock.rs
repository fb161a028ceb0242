//! The lock a server holds on its directory while it runs, so that two servers (two
//! processes, or two opens in one) never write the same files.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use crate::{EngineError, Result};

/// An exclusive lock on a directory (on its `LOCK` file), released when dropped or when the
/// process ends, however it ends.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir`, creating it if needed; an error if another server holds it.
    pub fn acquire(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(dir.join("LOCK"))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(TryLockError::WouldBlock) => {
                Err(EngineError::DirectoryInUse(dir.display().to_string()))
            }
            Err(TryLockError::Error(e)) => Err(e.into()),
        }
    }
}
