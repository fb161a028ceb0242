//! The log's small files beside its segments. The `state` file holds the hard state, the
//! membership (conf state) and the index/term of the last entry removed by log truncation; it
//! is replaced atomically when the term, the vote or the membership changes, or the log is
//! truncated. The commit index it holds may lag: a new commit index alone goes to the `commit`
//! file, written in place and not synced (see
//! [`DurableLog::set_hard_state`](super::DurableLog::set_hard_state)).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use raft::eraftpb::{ConfState, HardState};

use super::{corruption, sync_dir};
use crate::{wire, RaftError};

/// What the `state` file stores.
#[derive(Default, Clone)]
pub(super) struct PersistentState {
    pub(super) hard_state: HardState,
    pub(super) conf_state: ConfState,
    /// Index and term of the newest entry dropped by truncation (0/0 if none).
    pub(super) truncated_index: u64,
    pub(super) truncated_term: u64,
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

    pub(super) fn decode(path: &Path, bytes: &[u8]) -> Result<Self, RaftError> {
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

    /// Replaces the `state` file in `dir` atomically (temp file, fsync, rename, fsync of the
    /// directory; without the fsyncs unless `sync`).
    pub(super) fn write(&self, dir: &Path, sync: bool) -> Result<(), RaftError> {
        let tmp = dir.join("state.tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(&self.encode()?)?;
        if sync {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, dir.join("state"))?;
        if sync {
            sync_dir(dir)?;
        }
        Ok(())
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

/// `[commit index: u64][crc32 of it: u32]`, little-endian.
const COMMIT_HINT_BYTES: usize = 12;

/// The `commit` file of a log directory, kept open once written.
#[derive(Default)]
pub(super) struct CommitHint {
    file: Option<File>,
}

impl CommitHint {
    /// The commit index in the `commit` file in `dir`, if the file holds a whole, intact one.
    pub(super) fn read(dir: &Path) -> Option<u64> {
        let bytes = std::fs::read(dir.join("commit")).ok()?;
        let record = bytes.get(..COMMIT_HINT_BYTES)?;
        let commit = u64::from_le_bytes(record[..8].try_into().ok()?);
        let crc = u32::from_le_bytes(record[8..].try_into().ok()?);
        (crc32fast::hash(&record[..8]) == crc).then_some(commit)
    }

    /// Removes the `commit` file in `dir`, if there is one.
    pub(super) fn remove(dir: &Path) -> Result<(), RaftError> {
        match std::fs::remove_file(dir.join("commit")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Writes `commit` into the `commit` file in `dir`, in place and not synced.
    pub(super) fn write(&mut self, dir: &Path, commit: u64) -> Result<(), RaftError> {
        let file = match &mut self.file {
            Some(file) => file,
            hint => hint.insert(
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(dir.join("commit"))?,
            ),
        };
        let mut record = [0u8; COMMIT_HINT_BYTES];
        record[..8].copy_from_slice(&commit.to_le_bytes());
        let crc = crc32fast::hash(&record[..8]);
        record[8..].copy_from_slice(&crc.to_le_bytes());
        file.write_all_at(&record, 0)?;
        Ok(())
    }
}
