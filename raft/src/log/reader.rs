//! Opening a log: every segment is read into the [`MemStorage`] mirror raft-rs reads, and
//! checked to continue the one before it (or, where a new leader overwrote a suffix, to start
//! inside it). A torn record at the very end of the last segment (a crash during an append) is
//! cut off: that entry was never acknowledged. A bad record anywhere else is corruption and
//! opening fails. A segment that holds no entry is removed.

use std::fs::OpenOptions;
use std::path::Path;

use raft::eraftpb::Entry;
use raft::storage::MemStorage;

use super::segment::{read_segment, Segment};
use super::{corruption, sync_dir};
use crate::RaftError;

/// Reads every segment in `dir` into `mem`, the mirror, which holds nothing after
/// `truncated_index` yet; cuts off a torn tail of the last segment and removes segments that hold
/// no entry. Returns the segments kept, oldest first.
pub(super) fn read_segments(
    dir: &Path,
    truncated_index: u64,
    sync: bool,
    mem: &MemStorage,
) -> Result<Vec<Segment>, RaftError> {
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(first) = name
            .strip_suffix(".seg")
            .and_then(|n| n.parse::<u64>().ok())
        {
            segments.push(Segment {
                first_index: first,
                path,
                len: 0,
                recyclable: true,
            });
        }
    }
    segments.sort_by_key(|s| s.first_index);
    let last = segments.len().saturating_sub(1);
    // The index after what the mirror holds: each segment continues it or (a new leader
    // overwrote a suffix) starts inside it. Checked here, since MemStorage panics on a gap.
    let mut next_index = truncated_index.saturating_add(1);
    let mut newest = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter_mut().enumerate() {
        let (entries, valid_len, torn) = read_segment(&segment.path, segment.first_index)?;
        segment.len = valid_len;
        newest.push(entries.last().map(|e| e.index));
        if torn {
            if i != last {
                return Err(corruption(
                    &segment.path,
                    "damaged record before the end of the log",
                ));
            }
            tracing::warn!(segment = %segment.path.display(), "cutting off a torn record at the log tail");
            let file = OpenOptions::new().write(true).open(&segment.path)?;
            file.set_len(valid_len)?;
            file.sync_all()?;
        }
        let mut entries: Vec<Entry> = entries;
        // Entries at or below the truncation point were applied and dropped already.
        entries.retain(|e| e.index > truncated_index);
        if entries
            .first()
            .is_some_and(|first| first.index > next_index)
        {
            return Err(corruption(
                &segment.path,
                format!("gap in the log at index {next_index}"),
            ));
        }
        if let Some(pair) = entries
            .windows(2)
            .find(|p| p[0].index.checked_add(1) != Some(p[1].index))
        {
            return Err(corruption(
                &segment.path,
                format!("entry {} follows entry {}", pair[1].index, pair[0].index),
            ));
        }
        if let Some(e) = entries.last() {
            next_index = e.index.saturating_add(1);
        }
        mem.wl().append(&entries)?;
    }
    // A segment that holds no entry was created but never written (a crash between the
    // roll and the append), or rolled for the entries after a settled log's. It goes: a
    // segment is retired once the next one starts at the truncation point, as if that one
    // held the entries from there on. `kept`: each other segment with its newest entry.
    let found = segments.len();
    let mut kept: Vec<(Segment, u64)> = Vec::with_capacity(found);
    for (segment, newest) in segments.into_iter().zip(newest) {
        match newest {
            Some(newest) => kept.push((segment, newest)),
            None => {
                tracing::warn!(segment = %segment.path.display(), "removing an empty log segment");
                std::fs::remove_file(&segment.path)?;
            }
        }
    }
    if kept.len() < found && sync {
        sync_dir(dir)?;
    }
    // A segment the next one starts inside holds entries a new leader replaced.
    for i in 1..kept.len() {
        if kept[i - 1].1 >= kept[i].0.first_index {
            kept[i - 1].0.recyclable = false;
        }
    }
    Ok(kept.into_iter().map(|(segment, _)| segment).collect())
}
