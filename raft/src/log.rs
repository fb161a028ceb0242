//! The durable Raft log: the write-ahead log of a tablet.
//!
//! On disk a log directory holds segment files `<first index>.seg`, one `state` file, one
//! `commit` file and perhaps spare segments `spare-<n>`.
//! A segment is a sequence of records `[payload length: u32][crc32 of payload: u32][payload]`,
//! each payload one protobuf-encoded raft `Entry`, LZ4-compressed (size first) where that makes
//! it smaller (a log whose entries keep not compressing stops trying for a while), which the
//! length's top bit says, and ends at a record of length 0 (each append
//! writes one after its records, the next overwrites it) or at the end of the file. Appends go
//! to the newest segment, which rolls at `segment_bytes`; one fsync covers all entries of one
//! ready (group commit).
//!
//! A segment whose entries are all durable in the state machine is not deleted while the log
//! takes writes: it becomes a spare (up to [`SPARES`]), and a later segment is written over it. Writing over
//! blocks the file has, an fsync writes only the data, not the file's size and block map as
//! well (about 40 % less time per fsync here). Whatever follows the end record of a recycled
//! segment is from its earlier life: entries below the segment's first index. A log that
//! settles (everything durable) keeps no spares and starts a new, empty segment. The `state` file
//! holds the hard state, the conf state and the index/term of the last entry removed by log
//! truncation; it is replaced atomically (temp file, fsync, rename, fsync directory) when the
//! term, the vote or the membership changes, or the log is truncated (the commit index it holds
//! may lag: see [`DurableLog::set_hard_state`]).
//!
//! raft-rs reads the log through a [`MemStorage`] mirror, filled from the segments on open and
//! kept in step with every append. On open, a torn record at the very end of the last segment
//! (a crash during an append) is cut off: that entry was never acknowledged. A bad record
//! anywhere else is corruption and opening fails.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::Storage as _;

use crate::{wire, RaftError};

const RECORD_HEADER: usize = 8;
/// A record larger than this is not one we wrote: treat it as corruption, not as an allocation.
const MAX_RECORD_BYTES: usize = 1 << 30;

fn corruption(path: &Path, what: impl std::fmt::Display) -> RaftError {
    RaftError::Corruption(format!("{}: {what}", path.display()))
}

/// The commit index in the `commit` file at `path`, if the file holds a whole, intact one.
fn read_commit_hint(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let record = bytes.get(..COMMIT_HINT_BYTES)?;
    let commit = u64::from_le_bytes(record[..8].try_into().ok()?);
    let crc = u32::from_le_bytes(record[8..].try_into().ok()?);
    (crc32fast::hash(&record[..8]) == crc).then_some(commit)
}

/// The spare segments in log directory `dir`.
fn spares(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut spares = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(SPARE) {
            spares.push(entry.path());
        }
    }
    Ok(spares)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What the `state` file stores.
#[derive(Default, Clone)]
struct PersistentState {
    hard_state: HardState,
    conf_state: ConfState,
    /// Index and term of the newest entry dropped by truncation (0/0 if none).
    truncated_index: u64,
    truncated_term: u64,
}

impl PersistentState {
    fn encode(&self) -> Result<Vec<u8>, RaftError> {
        let hs = wire::encode(&self.hard_state);
        let cs = wire::encode(&self.conf_state);
        let mut body = Vec::with_capacity(32 + hs.len() + cs.len());
        body.extend_from_slice(&self.truncated_index.to_le_bytes());
        body.extend_from_slice(&self.truncated_term.to_le_bytes());
        body.extend_from_slice(&(hs.len() as u32).to_le_bytes());
        body.extend_from_slice(&hs);
        body.extend_from_slice(&cs);
        let mut out = crc32fast::hash(&body).to_le_bytes().to_vec();
        out.extend_from_slice(&body);
        Ok(out)
    }

    fn decode(path: &Path, bytes: &[u8]) -> Result<Self, RaftError> {
        let bad = || corruption(path, "state file is damaged");
        let (crc, body) = bytes.split_first_chunk::<4>().ok_or_else(bad)?;
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err(bad());
        }
        let (ti, rest) = body.split_first_chunk::<8>().ok_or_else(bad)?;
        let (tt, rest) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
        let (hl, rest) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
        let hl = u32::from_le_bytes(*hl) as usize;
        if rest.len() < hl {
            return Err(bad());
        }
        let (hs, cs) = rest.split_at(hl);
        let state = Self {
            hard_state: wire::decode::<HardState>(hs)?,
            conf_state: wire::decode::<ConfState>(cs)?,
            truncated_index: u64::from_le_bytes(*ti),
            truncated_term: u64::from_le_bytes(*tt),
        };
        check_membership(path, &state.conf_state)?;
        Ok(state)
    }
}

/// Nyala changes a group's membership one member at a time (`ConfChange`, never a joint
/// `ConfChangeV2`), so every membership it writes is simple: no outgoing voters, no member both
/// voter and learner, no member 0 (raft-rs's "no node"). raft-rs panics on a membership it
/// cannot restore, so any other is refused.
fn check_membership(path: &Path, cs: &ConfState) -> Result<(), RaftError> {
    let joint = !cs.voters_outgoing.is_empty() || !cs.learners_next.is_empty() || cs.auto_leave;
    let both = cs.learners.iter().any(|l| cs.voters.contains(l));
    if joint || both || cs.voters.contains(&0) || cs.learners.contains(&0) {
        return Err(corruption(
            path,
            format!("state file holds a membership Nyala does not write: {cs:?}"),
        ));
    }
    Ok(())
}

struct Segment {
    first_index: u64,
    path: PathBuf,
    /// Bytes of its records (a recycled segment's file is longer).
    len: u64,
    /// Whether it may become a spare: not if it holds entries a new leader replaced (the next
    /// segment starts inside it), which a recycled file's reader could take for new ones.
    recyclable: bool,
}

/// How a spare segment's file name starts (see the module comment).
const SPARE: &str = "spare-";
/// Spare segments a log keeps at most: a flush makes several segments durable at once.
const SPARES: usize = 4;

/// The log of one Raft group: durable segments plus the in-memory mirror raft-rs reads.
pub struct DurableLog {
    dir: PathBuf,
    segment_bytes: u64,
    sync: bool,
    mem: MemStorage,
    state: PersistentState,
    segments: Vec<Segment>,
    /// Bytes of the records in all segments.
    bytes: u64,
    /// The open newest segment and the bytes of its records (where the next append goes).
    active: Option<(File, u64)>,
    /// The spare segments in the directory.
    spares: Vec<PathBuf>,
    /// The `commit` file, once written ([`DurableLog::set_hard_state`]).
    commit_hint: Option<File>,
    compression: Compression,
    /// The buffer appends assemble their records in, kept from one to the next (up to
    /// [`SCRATCH_KEPT_BYTES`]): a fresh one each time meant its pages were taken from the
    /// system, and zeroed, on every append.
    scratch: Vec<u8>,
}

/// The largest append buffer kept for the next append.
const SCRATCH_KEPT_BYTES: usize = 64 << 20;

/// `[commit index: u64][crc32 of it: u32]`, little-endian.
const COMMIT_HINT_BYTES: usize = 12;

impl DurableLog {
    /// Opens the log in `dir`, creating a new group with `voters` if it is empty.
    pub fn open(
        dir: &Path,
        voters: &[u64],
        segment_bytes: u64,
        sync: bool,
    ) -> Result<Self, RaftError> {
        std::fs::create_dir_all(dir)?;
        let state_path = dir.join("state");
        let fresh = !state_path.exists();
        let state = if fresh {
            let mut state = PersistentState::default();
            state.conf_state.set_voters(voters.to_vec());
            state
        } else {
            PersistentState::decode(&state_path, &std::fs::read(&state_path)?)?
        };
        let mem = MemStorage::new();
        {
            let mut core = mem.wl();
            core.set_conf_state(state.conf_state.clone());
        }
        if state.truncated_index > 0 {
            let mut core = mem.wl();
            let mut snapshot = Snapshot::default();
            snapshot.mut_metadata().index = state.truncated_index;
            snapshot.mut_metadata().term = state.truncated_term;
            snapshot
                .mut_metadata()
                .set_conf_state(state.conf_state.clone());
            core.apply_snapshot(snapshot)?;
        }
        let mut log = Self {
            dir: dir.to_path_buf(),
            segment_bytes,
            sync,
            mem,
            state: state.clone(),
            segments: Vec::new(),
            bytes: 0,
            active: None,
            spares: spares(dir)?,
            commit_hint: None,
            compression: Compression::default(),
            scratch: Vec::new(),
        };
        log.load_segments()?;
        // Entries are synced before they can commit: a commit index beyond the log's end
        // means committed entries were lost, which opening the node reports.
        if let Some(commit) = read_commit_hint(&dir.join("commit")) {
            let hard_state = &mut log.state.hard_state;
            hard_state.commit = hard_state.commit.max(commit);
        }
        log.bytes = log.segments.iter().map(|s| s.len).sum();
        {
            let mut core = log.mem.wl();
            core.set_hardstate(log.state.hard_state.clone());
        }
        if fresh {
            log.write_state()?;
        }
        Ok(log)
    }

    /// Reads every segment into the mirror, cutting off a torn tail of the last one.
    fn load_segments(&mut self) -> Result<(), RaftError> {
        let mut segments = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
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
        let mut next_index = self.state.truncated_index.saturating_add(1);
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
            entries.retain(|e| e.index > self.state.truncated_index);
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
            self.mem.wl().append(&entries)?;
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
        if kept.len() < found && self.sync {
            sync_dir(&self.dir)?;
        }
        // A segment the next one starts inside holds entries a new leader replaced.
        for i in 1..kept.len() {
            if kept[i - 1].1 >= kept[i].0.first_index {
                kept[i - 1].0.recyclable = false;
            }
        }
        self.segments = kept.into_iter().map(|(segment, _)| segment).collect();
        Ok(())
    }

    pub fn storage(&self) -> &MemStorage {
        &self.mem
    }

    pub fn last_index(&self) -> u64 {
        self.mem.last_index().unwrap_or(self.state.truncated_index)
    }

    /// Appends entries durably (one fsync). Entries that overwrite a suffix replace it.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), RaftError> {
        if entries.is_empty() {
            return Ok(());
        }
        if entries[0].index <= self.last_index() {
            // A new leader overwrote our uncommitted suffix: start a segment at the first new index
            // (later segments are superseded, so drop them).
            let first = entries[0].index;
            self.active = None;
            // (Not recycled: they hold entries at or above `first`, which the reader would take
            // for new ones.)
            while let Some(seg) = self.segments.last() {
                if seg.first_index < first {
                    break;
                }
                self.bytes = self.bytes.saturating_sub(seg.len);
                std::fs::remove_file(&seg.path)?;
                self.segments.pop();
            }
            // The segment the new entries replace part of.
            if let Some(segment) = self.segments.last_mut() {
                segment.recyclable = false;
            }
            self.roll(first)?;
        }
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        for entry in entries {
            // Encoded in place, behind room for its header: an entry's rows are copied once.
            let header = buf.len();
            buf.extend_from_slice(&[0; RECORD_HEADER]);
            wire::encode_into(entry, &mut buf);
            let compressed = self.compression.store(&mut buf, header + RECORD_HEADER);
            let payload = &buf[header + RECORD_HEADER..];
            let len = payload.len() as u32 | if compressed { COMPRESSED } else { 0 };
            let crc = crc32fast::hash(payload);
            buf[header..header + 4].copy_from_slice(&len.to_le_bytes());
            buf[header + 4..header + RECORD_HEADER].copy_from_slice(&crc.to_le_bytes());
        }
        let records = buf.len() as u64;
        // The end record, which the next append overwrites.
        buf.extend_from_slice(&[0; RECORD_HEADER]);
        if self
            .active
            .as_ref()
            .is_none_or(|(_, size)| *size >= self.segment_bytes)
        {
            self.roll(entries[0].index)?;
        }
        let (file, size) = self.active.as_mut().ok_or_else(|| RaftError::Stopped)?;
        std::os::unix::fs::FileExt::write_all_at(file, &buf, *size)?;
        if self.sync {
            file.sync_data()?;
        }
        *size += records;
        self.bytes += records;
        if let Some(segment) = self.segments.last_mut() {
            segment.len += records;
        }
        self.mem.wl().append(entries)?;
        if buf.capacity() <= SCRATCH_KEPT_BYTES {
            self.scratch = buf;
        }
        Ok(())
    }

    /// Starts writing segment `first_index`: over the spare if there is one, or continuing the
    /// newest segment if it is that one (a restart before it took an entry).
    fn roll(&mut self, first_index: u64) -> Result<(), RaftError> {
        let path = self.dir.join(format!("{first_index:020}.seg"));
        let continued = self.segments.last().filter(|s| s.path == path);
        let size = continued.map_or(0, |s| s.len);
        if continued.is_none() {
            if let Some(spare) = self.spares.pop() {
                std::fs::rename(spare, &path)?;
            }
            self.segments.push(Segment {
                first_index,
                path: path.clone(),
                len: 0,
                recyclable: true,
            });
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)?;
        if self.sync {
            sync_dir(&self.dir)?;
        }
        self.active = Some((file, size));
        Ok(())
    }

    /// Disposes of segment `segment`, whose entries are all durable in the state machine: it
    /// becomes a spare if `recycle` and there are fewer than [`SPARES`], else it is deleted.
    fn retire(&mut self, segment: Segment, recycle: bool) -> Result<(), RaftError> {
        self.bytes = self.bytes.saturating_sub(segment.len);
        if recycle && segment.recyclable && self.spares.len() < SPARES {
            let spare = self.dir.join(format!("{SPARE}{}", segment.first_index));
            std::fs::rename(&segment.path, &spare)?;
            self.spares.push(spare);
        } else {
            std::fs::remove_file(&segment.path)?;
        }
        Ok(())
    }

    /// Records raft's hard state. The `state` file is rewritten (and synced) only when the
    /// term or the vote changed: those must survive any crash, as a node must never vote twice
    /// in a term. A new commit index alone goes to the small `commit` file, written in place
    /// and not synced: it survives the process (the kernel holds it), so a restart replays
    /// every entry it knew committed; after a power loss it may lag, and the replica learns the
    /// rest again from its leader (or, leading, by committing an entry of its new term). Every
    /// committed entry is in the synced log either way. Syncing the commit index at every
    /// commit cost two more fsyncs per write after the log's own.
    pub fn set_hard_state(&mut self, hs: HardState) -> Result<(), RaftError> {
        let written = &self.state.hard_state;
        let must_sync = hs.term != written.term || hs.vote != written.vote;
        let commit = hs.commit;
        self.mem.wl().set_hardstate(hs.clone());
        self.state.hard_state = hs;
        match must_sync {
            true => self.write_state(),
            false => self.write_commit_hint(commit),
        }
    }

    fn write_commit_hint(&mut self, commit: u64) -> Result<(), RaftError> {
        use std::os::unix::fs::FileExt;
        let file = match &mut self.commit_hint {
            Some(file) => file,
            hint => hint.insert(
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(self.dir.join("commit"))?,
            ),
        };
        let mut record = [0u8; COMMIT_HINT_BYTES];
        record[..8].copy_from_slice(&commit.to_le_bytes());
        let crc = crc32fast::hash(&record[..8]);
        record[8..].copy_from_slice(&crc.to_le_bytes());
        file.write_all_at(&record, 0)?;
        Ok(())
    }

    pub fn set_commit(&mut self, commit: u64) -> Result<(), RaftError> {
        let mut hs = self.state.hard_state.clone();
        hs.commit = commit;
        self.set_hard_state(hs)
    }

    /// Records a new membership (applied from a configuration change entry).
    pub fn set_conf_state(&mut self, conf_state: ConfState) -> Result<(), RaftError> {
        self.mem.wl().set_conf_state(conf_state.clone());
        self.state.conf_state = conf_state;
        self.write_state()
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.state.conf_state
    }

    /// Creates the log of a replica whose state machine was copied from another replica at
    /// entry `index` of term `term`: empty, starting after `index`, with membership `conf`.
    pub fn create_at(
        dir: &Path,
        index: u64,
        term: u64,
        conf: ConfState,
        sync: bool,
    ) -> Result<(), RaftError> {
        std::fs::create_dir_all(dir)?;
        // A commit index left by an earlier replica in this directory is not this log's.
        match std::fs::remove_file(dir.join("commit")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let mut state = PersistentState {
            conf_state: conf,
            truncated_index: index,
            truncated_term: term,
            ..PersistentState::default()
        };
        state.hard_state.term = term;
        state.hard_state.commit = index;
        let log = Self {
            dir: dir.to_path_buf(),
            segment_bytes: 0,
            sync,
            mem: MemStorage::new(),
            state,
            segments: Vec::new(),
            bytes: 0,
            active: None,
            spares: Vec::new(),
            commit_hint: None,
            compression: Compression::default(),
            scratch: Vec::new(),
        };
        log.write_state()
    }

    pub fn hard_state(&self) -> &HardState {
        &self.state.hard_state
    }

    fn write_state(&self) -> Result<(), RaftError> {
        let tmp = self.dir.join("state.tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(&self.state.encode()?)?;
        if self.sync {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join("state"))?;
        if self.sync {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Drops entries up to `index` (inclusive) from memory, and the segments that hold only
    /// such entries from disk: their effects are durable in the state machine.
    pub fn truncate_prefix(&mut self, index: u64) -> Result<(), RaftError> {
        let index = index.min(self.last_index());
        if index <= self.state.truncated_index {
            return Ok(());
        }
        let Ok(term) = self.mem.term(index) else {
            return Ok(());
        };
        // Keep the entry at `index` in memory so raft-rs can still read its term.
        self.mem.wl().compact(index)?;
        let mut state = self.state.clone();
        state.truncated_index = index;
        state.truncated_term = term;
        self.state = state;
        self.write_state()?;
        // When everything logged is durable, the newest segment (if it holds anything) is
        // closed and a new, empty one started, so the old one can go too; a log that settles
        // keeps no spares.
        let active_bytes = self.active.as_ref().map_or(0, |(_, size)| *size);
        let settled = index >= self.last_index();
        if settled {
            for spare in self.spares.drain(..) {
                std::fs::remove_file(spare)?;
            }
        }
        if settled && active_bytes > 0 {
            self.active = None;
            self.roll(index + 1)?;
        }
        // A segment can go when the next one starts at or below index + 1.
        while self.segments.len() > 1 && self.segments[1].first_index <= index + 1 {
            let segment = self.segments.remove(0);
            self.retire(segment, !settled)?;
        }
        Ok(())
    }

    /// Bytes the log's segment files take.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Index of the newest entry removed by truncation.
    pub fn truncated_index(&self) -> u64 {
        self.state.truncated_index
    }
}

/// The length field's top bit: the payload is LZ4-compressed (lengths stay below 2^30).
const COMPRESSED: u32 = 1 << 31;

/// Entries smaller than this are stored as they are (too little to gain).
const COMPRESS_FROM_BYTES: usize = 512;
/// Entries in a row that compression shrank by less than an eighth, after which the log stops
/// trying for a while.
const MISSES_BEFORE_SKIPPING: u32 = 8;
/// Entries stored as they are, without trying, once compression stopped paying.
const ENTRIES_SKIPPED: u32 = 256;

/// How a log compresses its entries: with LZ4 (the length first) where that makes them
/// smaller. A log whose entries keep not compressing (binary, encrypted or already compressed
/// messages: [`MISSES_BEFORE_SKIPPING`] in a row shrunk by less than an eighth) stores the next
/// [`ENTRIES_SKIPPED`] as they are without spending the CPU on trying, then tries again.
#[derive(Default)]
struct Compression {
    misses: u32,
    skip: u32,
}

impl Compression {
    /// Compresses the encoded entry at `buf[from..]` in place where that makes it smaller;
    /// returns whether it did.
    fn store(&mut self, buf: &mut Vec<u8>, from: usize) -> bool {
        let encoded = &buf[from..];
        if encoded.len() < COMPRESS_FROM_BYTES {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        let compressed = lz4_flex::compress_prepend_size(encoded);
        if compressed.len() <= encoded.len() - encoded.len() / 8 {
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= MISSES_BEFORE_SKIPPING {
                self.misses = 0;
                self.skip = ENTRIES_SKIPPED;
            }
        }
        if compressed.len() >= encoded.len() {
            return false;
        }
        buf.truncate(from);
        buf.extend_from_slice(&compressed);
        true
    }
}

/// A compressed payload's entry bytes; its declared size is bounded like a record's.
fn decompress(payload: &[u8]) -> Result<Vec<u8>, String> {
    let size = payload
        .first_chunk::<4>()
        .map(|n| u32::from_le_bytes(*n) as usize)
        .ok_or("compressed record without its size")?;
    if size > MAX_RECORD_BYTES {
        return Err(format!("compressed record claims {size} bytes"));
    }
    lz4_flex::decompress_size_prepended(payload).map_err(|e| e.to_string())
}

/// Reads the records of segment `path`, whose first entry is `first_index`: (entries, length
/// of the valid prefix, whether a damaged record followed it). A record of length 0, or one
/// holding an entry below `first_index` (from before the file was recycled), ends it.
fn read_segment(path: &Path, first_index: u64) -> Result<(Vec<Entry>, u64, bool), RaftError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, data: Vec<u8>) -> Entry {
        let mut e = Entry::default();
        e.index = index;
        e.term = 1;
        e.data = data.into();
        e
    }

    /// Large entries are stored compressed where that is smaller, small and incompressible ones
    /// as they are, and all of them read back as written.
    #[test]
    fn entries_are_compressed_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let repetitive = |i: u64| format!("row {i} ").repeat(500).into_bytes();
        let random: Vec<u8> = (0..4000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let entries = vec![
            entry(1, repetitive(1)),
            entry(2, b"tiny".to_vec()),
            entry(3, random.clone()),
            entry(4, repetitive(4)),
        ];
        let raw: usize = entries.iter().map(|e| e.data.len()).sum();
        {
            let mut log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
            log.append(&entries).unwrap();
            assert!(
                (log.bytes() as usize) < raw / 2,
                "{} bytes for {raw}",
                log.bytes()
            );
        }
        let log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
        let read = log
            .storage()
            .entries(1, 5, u64::MAX, raft::GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(read, entries);
    }

    /// A log whose entries do not compress stops trying for a while (they are stored as they
    /// are, compressible or not), then tries again; every entry reads back as written.
    #[test]
    fn a_log_of_incompressible_entries_stops_compressing_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = || {
            (0..2000)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect::<Vec<u8>>()
        };
        let repetitive = "the same row again ".repeat(100).into_bytes();
        let mut log = DurableLog::open(dir.path(), &[1], 1 << 24, false).unwrap();
        let mut index = 0;
        // The growth of the log by one entry of `data`.
        let mut append = |log: &mut DurableLog, data: Vec<u8>| {
            index += 1;
            let before = log.bytes();
            log.append(&[entry(index, data)]).unwrap();
            (log.bytes() - before) as usize
        };
        let stored_whole = |grown: usize, len: usize| grown > len;
        for _ in 0..MISSES_BEFORE_SKIPPING {
            let data = random();
            assert!(stored_whole(append(&mut log, data), 2000));
        }
        // Compressible, but within the entries the log does not try to compress.
        for _ in 0..ENTRIES_SKIPPED {
            let grown = append(&mut log, repetitive.clone());
            assert!(stored_whole(grown, repetitive.len()));
        }
        // Tried again, and compressed.
        let grown = append(&mut log, repetitive.clone());
        assert!(grown < repetitive.len() / 4, "{grown}");
        // A miss or two among compressible entries does not stop it.
        let data = random();
        append(&mut log, data);
        let grown = append(&mut log, repetitive.clone());
        assert!(grown < repetitive.len() / 4, "{grown}");
        let last = log.last_index();
        let written = read_all(&log, 1, last + 1);
        drop(log);
        let log = DurableLog::open(dir.path(), &[1], 1 << 24, false).unwrap();
        assert_eq!(read_all(&log, 1, last + 1), written);
        assert_eq!(written.len() as u64, last);
    }

    fn read_all(log: &DurableLog, from: u64, to: u64) -> Vec<Entry> {
        let context = raft::GetEntriesContext::empty(false);
        log.storage().entries(from, to, u64::MAX, context).unwrap()
    }

    fn lengths(dir: &Path) -> Vec<(String, u64)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    e.file_name().to_string_lossy().to_string(),
                    e.metadata().unwrap().len(),
                )
            })
            .filter(|(name, _)| name.ends_with(".seg") || name.starts_with(SPARE))
            .collect();
        files.sort();
        files
    }

    /// Under writes, a segment whose entries are durable is written over as a later segment;
    /// reopened, the log holds exactly the entries appended, none from the file's earlier life,
    /// also when the recycled segment took no entry before a crash. A log that settles keeps
    /// no spares.
    #[test]
    fn durable_segments_are_written_over_and_read_back_without_their_old_entries() {
        let dir = tempfile::tempdir().unwrap();
        // Later entries are shorter: the recycled file outlasts its new records.
        let data = |i: u64| {
            let pad = if i <= 30 { 200 } else { 50 };
            format!("entry {i} {}", "x".repeat(pad)).into_bytes()
        };
        let all: Vec<Entry> = (1..=60).map(|i| entry(i, data(i))).collect();
        {
            let mut log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
            for chunk in all[..30].chunks(3) {
                log.append(chunk).unwrap();
            }
            // Entries up to 20 are durable; 21 to 30 not yet: the log takes writes.
            log.truncate_prefix(20).unwrap();
            assert!(!log.spares.is_empty(), "{:?}", lengths(dir.path()));
            for chunk in all[30..].chunks(3) {
                log.append(chunk).unwrap();
            }
            assert_eq!(read_all(&log, 21, 61), all[20..]);
            // Some segment is a recycled file, longer than its records.
            let logical: u64 = log.segments.iter().map(|s| s.len).sum();
            let physical: u64 = log
                .segments
                .iter()
                .map(|s| std::fs::metadata(&s.path).unwrap().len())
                .sum();
            assert!(
                physical > logical + 8 * log.segments.len() as u64,
                "{physical} {logical}"
            );
            assert_eq!(log.bytes(), logical);
        }
        let log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
        assert_eq!(read_all(&log, 21, 61), all[20..]);
        drop(log);
        // A crash right after a spare was renamed to the next segment, before its first
        // entry: a segment file starting with older entries holds none.
        let oldest = dir.path().join(&lengths(dir.path())[0].0);
        let next = dir.path().join(format!("{:020}.seg", 61));
        std::fs::copy(oldest, next).unwrap();
        let mut log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
        assert_eq!(log.last_index(), 60);
        log.append(&[entry(61, data(61))]).unwrap();
        assert_eq!(read_all(&log, 61, 62), vec![entry(61, data(61))]);
        // Settled: no spares, and the newest segment is a new, empty file.
        log.truncate_prefix(61).unwrap();
        assert!(log.spares.is_empty() && spares(dir.path()).unwrap().is_empty());
        assert_eq!(log.bytes(), 0);
        drop(log);
        let log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
        assert_eq!(log.last_index(), 61);
    }

    /// A segment in which a new leader replaced entries is deleted, never written over: its
    /// replaced entries are above the next segment's first index. Also after a restart.
    #[test]
    fn segments_with_replaced_entries_are_not_recycled() {
        for restart in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
            let old: Vec<Entry> = (1..=10).map(|i| entry(i, vec![1; 50])).collect();
            log.append(&old).unwrap();
            let new: Vec<Entry> = (6..=20)
                .map(|i| Entry {
                    term: 2,
                    ..entry(i, vec![2; 50])
                })
                .collect();
            log.append(&new[..3]).unwrap();
            log.append(&new[3..]).unwrap();
            if restart {
                drop(log);
                log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
            }
            assert_eq!(read_all(&log, 6, 21), new);
            log.truncate_prefix(7).unwrap();
            assert!(log.spares.is_empty(), "restart {restart}");
            assert_eq!(log.segments.len(), 1);
        }
    }

    /// Random appends, suffix overwrites by a new term, truncations (some while the log takes
    /// writes, so segments are recycled, some settling it) and reopenings, with small segments,
    /// against a model of the entries the log must hold.
    #[test]
    fn random_appends_overwrites_truncations_and_reopens_match_a_model() {
        use rand::{Rng, SeedableRng};
        for seed in 0..8u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let dir = tempfile::tempdir().unwrap();
            let open = || DurableLog::open(dir.path(), &[1], 600, true).unwrap();
            let mut log = open();
            // The entries after the truncation point, in index order.
            let mut model: Vec<Entry> = Vec::new();
            let (mut truncated, mut term) = (0u64, 1u64);
            let mut recycled = 0;
            for step in 0..400 {
                let last = truncated + model.len() as u64;
                match rng.random_range(0..20) {
                    0..=11 => {
                        let n = rng.random_range(1..5);
                        let batch: Vec<Entry> = (last + 1..=last + n)
                            .map(|i| {
                                let len = rng.random_range(1..300);
                                Entry {
                                    term,
                                    ..entry(i, vec![(i % 251) as u8; len])
                                }
                            })
                            .collect();
                        log.append(&batch).unwrap();
                        model.extend(batch);
                    }
                    12..=13 if !model.is_empty() => {
                        // A new leader replaces a suffix.
                        term += 1;
                        let from = rng.random_range(truncated + 1..=last);
                        model.truncate((from - truncated - 1) as usize);
                        let batch: Vec<Entry> = (from..from + rng.random_range(1..4))
                            .map(|i| Entry {
                                term,
                                ..entry(i, vec![term as u8; 40])
                            })
                            .collect();
                        log.append(&batch).unwrap();
                        model.extend(batch);
                    }
                    14..=16 if !model.is_empty() => {
                        // Durable up to a random point, or everything (the log settles).
                        let to = match rng.random_bool(0.3) {
                            true => last,
                            false => rng.random_range(truncated..=last),
                        };
                        log.truncate_prefix(to).unwrap();
                        if to > truncated {
                            model.drain(..(to - truncated) as usize);
                            truncated = to;
                        }
                        assert!(log.spares.len() <= SPARES);
                        recycled += log.spares.len();
                    }
                    _ => {
                        drop(log);
                        log = open();
                    }
                }
                let last = truncated + model.len() as u64;
                assert_eq!(log.last_index(), last, "seed {seed} step {step}");
                if !model.is_empty() {
                    assert_eq!(
                        read_all(&log, truncated + 1, last + 1),
                        model,
                        "seed {seed} step {step}"
                    );
                }
            }
            assert!(
                recycled > 0,
                "seed {seed}: no segment was kept to be written over"
            );
        }
    }

    /// A segment created but never written before a crash holds nothing. The log that reopens
    /// removes it: truncation retires a segment once the next one starts at the truncation
    /// point, and the empty one would have retired the entries only the older segment holds.
    #[test]
    fn an_empty_segment_left_by_a_crash_does_not_make_truncation_drop_entries() {
        let dir = tempfile::tempdir().unwrap();
        let first: Vec<Entry> = (1..=10)
            .map(|i| entry(i, format!("entry {i}").into_bytes()))
            .collect();
        DurableLog::open(dir.path(), &[1], 1 << 20, true)
            .unwrap()
            .append(&first)
            .unwrap();
        // A new leader's entries from index 6 on: the segment was made, then the crash.
        File::create(dir.path().join(format!("{:020}.seg", 6))).unwrap();
        // Another leader keeps 6 and 7 and replaces the entries from 8 on.
        let newer: Vec<Entry> = (8..=9)
            .map(|i| Entry {
                term: 2,
                ..entry(i, format!("newer {i}").into_bytes())
            })
            .collect();
        {
            let mut log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
            assert_eq!(read_all(&log, 1, 11), first);
            log.append(&newer).unwrap();
            log.truncate_prefix(5).unwrap();
        }
        let log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
        let expected: Vec<Entry> = first[5..7].iter().chain(&newer).cloned().collect();
        assert_eq!(read_all(&log, 6, 10), expected);
    }
}
