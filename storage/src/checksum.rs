//! Whole-file checksums: every rowset and delta file is written through a [`ChecksumWriter`]
//! and its CRC32 recorded in the tablet metadata (itself checksummed), and a file is verified
//! against it when the tablet opens, so a damaged file is reported instead of read.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use crate::StorageError;

/// A file being written, with the CRC32 of everything written so far.
pub struct ChecksumWriter {
    file: File,
    hasher: crc32fast::Hasher,
}

impl ChecksumWriter {
    pub fn create(path: &Path) -> Result<Self, StorageError> {
        Ok(Self {
            file: File::create(path)?,
            hasher: crc32fast::Hasher::new(),
        })
    }

    /// Syncs the file to disk; returns its checksum.
    pub fn finish(self) -> Result<u32, StorageError> {
        self.file.sync_all()?;
        Ok(self.hasher.finalize())
    }
}

impl Write for ChecksumWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Checks that the file at `path` has checksum `expected`.
pub fn verify(path: &Path, expected: u32) -> Result<(), StorageError> {
    let mut file = File::open(path).map_err(StorageError::on(path))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let actual = hasher.finalize();
    if actual != expected {
        return Err(StorageError::Corruption(format!(
            "{} is damaged: checksum {actual:08x}, expected {expected:08x}",
            path.display()
        )));
    }
    Ok(())
}
