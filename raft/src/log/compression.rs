//! LZ4 compression of log entries. Entries of [`COMPRESS_FROM_BYTES`] or more are stored
//! compressed (the decompressed size first) where that makes them smaller, which the record's
//! length field says.

use super::{MAX_RECORD_BYTES, SCRATCH_KEPT_BYTES};

/// Entries smaller than this are stored as they are (too little to gain).
const COMPRESS_FROM_BYTES: usize = 512;
/// Entries in a row that compression shrank by less than an eighth, after which the log stops
/// trying for a while.
pub(super) const MISSES_BEFORE_SKIPPING: u32 = 8;
/// Entries stored as they are, without trying, once compression stopped paying.
pub(super) const ENTRIES_SKIPPED: u32 = 256;

/// How a log compresses its entries: with LZ4 (the length first) where that makes them
/// smaller. A log whose entries keep not compressing (binary, encrypted or already compressed
/// messages: [`MISSES_BEFORE_SKIPPING`] in a row shrunk by less than an eighth) stores the next
/// [`ENTRIES_SKIPPED`] as they are without spending the CPU on trying, then tries again.
#[derive(Default)]
pub(super) struct Compression {
    misses: u32,
    skip: u32,
    /// Where an entry is compressed to before it replaces the encoded one, kept between entries
    /// (up to [`SCRATCH_KEPT_BYTES`]): a fresh buffer for each was a zeroed allocation as large
    /// as the entry, then copied again when lz4_flex shrank it (a twentieth of a bulk load's
    /// Raft threads).
    out: Vec<u8>,
}

impl Compression {
    /// Compresses the encoded entry at `buf[from..]` in place where that makes it smaller;
    /// returns whether it did.
    pub(super) fn store(&mut self, buf: &mut Vec<u8>, from: usize) -> bool {
        let encoded = &buf[from..];
        if encoded.len() < COMPRESS_FROM_BYTES {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        let max = lz4_flex::block::get_maximum_output_size(encoded.len());
        if self.out.len() < max {
            self.out.resize(max, 0);
        }
        // The output has room for any input: this cannot fail.
        let Ok(n) = lz4_flex::block::compress_into(encoded, &mut self.out[..max]) else {
            return false;
        };
        // Stored as lz4_flex's `compress_prepend_size` stores it: the entry's size first.
        let size = (encoded.len() as u32).to_le_bytes();
        let compressed = size.len() + n;
        if compressed <= encoded.len() - encoded.len() / 8 {
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= MISSES_BEFORE_SKIPPING {
                self.misses = 0;
                self.skip = ENTRIES_SKIPPED;
            }
        }
        let stored = compressed < encoded.len();
        if stored {
            buf.truncate(from);
            buf.extend_from_slice(&size);
            buf.extend_from_slice(&self.out[..n]);
        }
        if self.out.len() > SCRATCH_KEPT_BYTES {
            self.out = Vec::new();
        }
        stored
    }
}

/// A compressed payload's entry bytes; its declared size is bounded like a record's.
pub(super) fn decompress(payload: &[u8]) -> Result<Vec<u8>, String> {
    let size = payload
        .first_chunk::<4>()
        .map(|n| u32::from_le_bytes(*n) as usize)
        .ok_or("compressed record without its size")?;
    if size > MAX_RECORD_BYTES {
        return Err(format!("compressed record claims {size} bytes"));
    }
    lz4_flex::decompress_size_prepended(payload).map_err(|e| e.to_string())
}
