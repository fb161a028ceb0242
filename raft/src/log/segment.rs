//! Segment files and their records. A segment `<first index>.seg` is a sequence of records
//! `[payload length: u32][crc32 of payload: u32][payload]`, each payload one protobuf-encoded
//! raft `Entry`, LZ4-compressed where that makes it smaller (the length's top bit says so), and
//! ends at a record of length 0 (each append writes one after its records, the next overwrites
//! it) or at the end of the file. A recycled segment (a spare written over) may hold records
//! from its earlier life after its end record: entries below its first index.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use raft::eraftpb::Entry;

use super::compression::{decompress, Compression};
use super::{corruption, MAX_RECORD_BYTES};
use crate::{wire, RaftError};

const RECORD_HEADER: usize = 8;
/// The length field's top bit: the payload is LZ4-compressed (lengths stay below 2^30).
pub(super) const COMPRESSED: u32 = 1 << 31;

pub(super) struct Segment {
    pub(super) first_index: u64,
    pub(super) path: PathBuf,
    /// Bytes of its records (a recycled segment's file is longer).
    pub(super) len: u64,
    /// Whether it may become a spare: not if it holds entries a new leader replaced (the next
    /// segment starts inside it), which a recycled file's reader could take for new ones.
    pub(super) recyclable: bool,
}

/// How a spare segment's file name starts (see the module comment of `log`).
pub(super) const SPARE: &str = "spare-";
/// Spare segments a log keeps at most: a flush makes several segments durable at once.
pub(super) const SPARES: usize = 4;

/// The spare segments in log directory `dir`.
pub(super) fn spares(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut spares = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(SPARE) {
            spares.push(entry.path());
        }
    }
    Ok(spares)
}

/// Appends `entry` to `buf` as one record, its payload compressed if `compression` finds that
/// worth it.
pub(super) fn push_record(buf: &mut Vec<u8>, entry: &Entry, compression: &mut Compression) {
    // Encoded in place, behind room for its header: an entry's rows are copied once.
    let header = buf.len();
    buf.extend_from_slice(&[0; RECORD_HEADER]);
    wire::encode_into(entry, buf);
    let compressed = compression.store(buf, header + RECORD_HEADER);
    let payload = &buf[header + RECORD_HEADER..];
    let len = payload.len() as u32 | if compressed { COMPRESSED } else { 0 };
    let crc = crc32fast::hash(payload);
    buf[header..header + 4].copy_from_slice(&len.to_le_bytes());
    buf[header + 4..header + RECORD_HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// Appends the end record, which the next append writes over.
pub(super) fn push_end_record(buf: &mut Vec<u8>) {
    buf.extend_from_slice(&[0; RECORD_HEADER]);
}

/// Reads the records of segment `path`, whose first entry is `first_index`: (entries, length
/// of the valid prefix, whether a damaged record followed it). A record of length 0, or one
/// holding an entry below `first_index` (from before the file was recycled), ends it.
pub(super) fn read_segment(
    path: &Path,
    first_index: u64,
) -> Result<(Vec<Entry>, u64, bool), RaftError> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let mut entries = Vec::new();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let Some(header) = bytes.get(pos..pos + RECORD_HEADER) else {
            return Ok((entries, pos as u64, true));
        };
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if len == 0 {
            return Ok((entries, pos as u64, false));
        }
        let compressed = len & COMPRESSED != 0;
        let len = (len & !COMPRESSED) as usize;
        if len > MAX_RECORD_BYTES {
            return Ok((entries, pos as u64, true));
        }
        let Some(payload) = bytes.get(pos + RECORD_HEADER..pos + RECORD_HEADER + len) else {
            return Ok((entries, pos as u64, true));
        };
        if crc32fast::hash(payload) != crc {
            return Ok((entries, pos as u64, true));
        }
        let entry = match compressed {
            true => {
                let payload = decompress(payload).map_err(|e| corruption(path, e))?;
                wire::decode::<Entry>(&payload)
            }
            false => wire::decode::<Entry>(payload),
        };
        let entry = entry.map_err(|e| corruption(path, e))?;
        if entry.index < first_index {
            return Ok((entries, pos as u64, false));
        }
        entries.push(entry);
        pos += RECORD_HEADER + len;
    }
    Ok((entries, pos as u64, false))
}
