//! Fuzz targets: a Raft log on disk damaged every way a crash, a bad disk or a hand edit could —
//! bytes flipped, cut, inserted; records whose checksums still match but whose entries say
//! nonsense; a state file with another membership, commit index or truncation point; segments
//! missing or renamed — and then opened. Opening must fail with an error, cut a torn tail, or
//! give a node that works; it must never panic or hang. See the `nyala-fuzzing` crate for the
//! budget (`NYALA_FUZZ_SECS`, `NYALA_FUZZ_SEED`, ...):
//! `NYALA_FUZZ_SECS=600 cargo test --release -p nyala-raft --test replay fuzz_`.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use nyala_fuzzing::{some_edits, within, Arbitrary, ByteEdit, Fuzz, Num, Unstructured};
use nyala_raft::{MembershipChange, RaftConfig, RaftError, RaftNode, StateMachine};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, EntryType, HardState};

/// Keeps the commands it applies; `durable` is what a flush made durable.
struct Sink {
    durable: u64,
    applied: u64,
    commands: Vec<Vec<u8>>,
}

impl Sink {
    fn new(durable: u64) -> Self {
        Self {
            durable,
            applied: durable,
            commands: Vec::new(),
        }
    }
}

impl StateMachine for Sink {
    type Output = u64;
    fn durable_index(&self) -> u64 {
        self.durable
    }
    fn apply(&mut self, index: u64, command: &bytes::Bytes) -> u64 {
        self.applied = index;
        self.commands.push(command.to_vec());
        index
    }
}

fn config(wal: &Path) -> RaftConfig {
    let mut config = RaftConfig::new(1, wal);
    config.segment_bytes = 256; // several segments
    config.sync = false;
    config
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// The files of a valid log (name, bytes; `state` last) and the index its state machine is
/// durable at: commands of all sizes, a membership change, a flush that truncated the log.
struct ValidLog {
    files: Vec<(String, Vec<u8>)>,
    durable: u64,
}

fn valid_log() -> &'static ValidLog {
    static LOG: OnceLock<ValidLog> = OnceLock::new();
    LOG.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("wal");
        let node = RaftNode::open(config(&wal), Sink::new(0)).unwrap();
        let durable = runtime().block_on(async {
            let mut durable = 0;
            for i in 0..24usize {
                node.propose(vec![i as u8; 1 + i * 7 % 40]).await.unwrap();
                if i == 8 {
                    let change = MembershipChange::AddLearner(2);
                    node.change_membership(change, b"ctx".to_vec())
                        .await
                        .unwrap();
                }
                if i == 12 {
                    durable = node
                        .with_state_machine(|sm| {
                            sm.durable = sm.applied;
                            sm.applied
                        })
                        .unwrap();
                    node.state_machine_flushed();
                }
            }
            durable
        });
        drop(node);
        let mut files = nyala_fuzzing::files_in(&wal);
        files.sort_by_key(|(name, _)| (name == "state", name.clone()));
        assert!(files.len() > 3, "several segments and the state file");
        ValidLog { files, durable }
    })
}

/// One damage to the log's files (`file` and `record` are taken modulo what there is).
#[derive(Debug, Arbitrary)]
enum Damage {
    /// Raw bytes of a segment or the state file: checksums catch most of it.
    Bytes {
        file: u8,
        edits: Vec<ByteEdit>,
    },
    /// The payload of one record, its checksum made to match again.
    Payload {
        file: u8,
        record: u8,
        edits: Vec<ByteEdit>,
    },
    /// An entry re-encoded with other fields (and a matching checksum).
    Entry {
        file: u8,
        record: u8,
        index: Option<Num>,
        term: Option<Num>,
        entry_type: Option<u8>,
        data: Option<Vec<u8>>,
    },
    /// The state file re-encoded with other values (and a matching checksum).
    State {
        term: Option<Num>,
        vote: Option<Num>,
        commit: Option<Num>,
        truncated_index: Option<Num>,
        truncated_term: Option<Num>,
        voters: Option<Vec<u8>>,
        learners: Option<Vec<u8>>,
        voters_outgoing: Option<Vec<u8>>,
    },
    Remove {
        file: u8,
    },
    /// A segment under another first index (the name the log sorts segments by).
    Rename {
        file: u8,
        first_index: Num,
    },
}

#[derive(Debug)]
struct Input {
    /// The state machine's durable index, near the valid one.
    durable: Num,
    damage: Vec<Damage>,
}

fn input(u: &mut Unstructured) -> arbitrary::Result<Input> {
    let n = u.int_in_range(1..=3)?;
    Ok(Input {
        durable: match u.ratio(3, 4)? {
            true => Num::Near(0),
            false => Num::arbitrary(u)?,
        },
        damage: (0..n)
            .map(|_| match Damage::arbitrary(u)? {
                // Few raw edits per file, so that most records survive.
                Damage::Bytes { file, .. } => Ok(Damage::Bytes {
                    file,
                    edits: some_edits(u, 3)?,
                }),
                other => Ok(other),
            })
            .collect::<arbitrary::Result<_>>()?,
    })
}

/// A segment's records: (start, length of the payload).
fn records(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(header) = bytes.get(pos..pos + 8) {
        let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
        if pos + 8 + len > bytes.len() {
            break;
        }
        out.push((pos, len));
        pos += 8 + len;
    }
    out
}

/// Replaces the payload of the record at `start` (of `len` bytes), with a matching checksum.
fn replace_payload(bytes: &mut Vec<u8>, (start, len): (usize, usize), payload: &[u8]) {
    let mut record = (payload.len() as u32).to_le_bytes().to_vec();
    record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    record.extend_from_slice(payload);
    bytes.splice(start..start + 8 + len, record);
}

/// The state file's parts: (truncated index, truncated term, hard state, conf state), as
/// `raft/src/log.rs` writes them behind their CRC.
fn decode_state(bytes: &[u8]) -> Option<(u64, u64, HardState, ConfState)> {
    let body = bytes.get(4..)?;
    let hl = u32::from_le_bytes(body.get(16..20)?.try_into().ok()?) as usize;
    let hs = HardState::parse_from_bytes(body.get(20..20 + hl)?).ok()?;
    let cs = ConfState::parse_from_bytes(body.get(20 + hl..)?).ok()?;
    let ti = u64::from_le_bytes(body[..8].try_into().ok()?);
    let tt = u64::from_le_bytes(body[8..16].try_into().ok()?);
    Some((ti, tt, hs, cs))
}

fn encode_state(ti: u64, tt: u64, hs: &HardState, cs: &ConfState) -> Vec<u8> {
    let hs = hs.write_to_bytes().unwrap();
    let mut body = ti.to_le_bytes().to_vec();
    body.extend_from_slice(&tt.to_le_bytes());
    body.extend_from_slice(&(hs.len() as u32).to_le_bytes());
    body.extend_from_slice(&hs);
    body.extend_from_slice(&cs.write_to_bytes().unwrap());
    let mut out = crc32fast::hash(&body).to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

fn ids(ids: &[u8]) -> Vec<u64> {
    ids.iter().map(|&id| id as u64 % 5).collect()
}

/// The segment a damage picks: its index in `files` (segments sort before the state file).
fn segment(files: &[(String, Vec<u8>)], file: u8) -> Option<usize> {
    let segments = files.iter().filter(|(n, _)| n.ends_with(".seg")).count();
    (segments > 0).then(|| file as usize % segments)
}

/// The record a damage picks: its segment's index in `files` and its (offset, length).
fn record_at(files: &[(String, Vec<u8>)], file: u8, record: u8) -> Option<(usize, (usize, usize))> {
    let file = segment(files, file)?;
    let records = records(&files[file].1);
    let picked = *records.get(record as usize % records.len().max(1))?;
    Some((file, picked))
}

/// `files` with `damage` done to them.
fn damaged(mut files: Vec<(String, Vec<u8>)>, damage: &[Damage]) -> Vec<(String, Vec<u8>)> {
    for damage in damage {
        if files.is_empty() {
            break;
        }
        match damage {
            Damage::Bytes { file, edits } => {
                let file = *file as usize % files.len();
                edits.iter().for_each(|e| e.apply(&mut files[file].1));
            }
            Damage::Payload {
                file,
                record,
                edits,
            } => {
                let Some((file, (start, len))) = record_at(&files, *file, *record) else {
                    continue;
                };
                let bytes = &mut files[file].1;
                let payload = nyala_fuzzing::edited(&bytes[start + 8..start + 8 + len], edits);
                replace_payload(bytes, (start, len), &payload);
            }
            Damage::Entry {
                file,
                record,
                index,
                term,
                entry_type,
                data,
            } => {
                let Some((file, (start, len))) = record_at(&files, *file, *record) else {
                    continue;
                };
                let bytes = &mut files[file].1;
                let Ok(mut entry) = Entry::parse_from_bytes(&bytes[start + 8..start + 8 + len])
                else {
                    continue;
                };
                if let Some(index) = index {
                    entry.index = index.apply(entry.index);
                }
                if let Some(term) = term {
                    entry.term = term.apply(entry.term);
                }
                if let Some(t) = entry_type {
                    entry.set_entry_type(match t % 3 {
                        0 => EntryType::EntryNormal,
                        1 => EntryType::EntryConfChange,
                        _ => EntryType::EntryConfChangeV2,
                    });
                }
                if let Some(data) = data {
                    entry.data = data.clone().into();
                }
                replace_payload(bytes, (start, len), &entry.write_to_bytes().unwrap());
            }
            Damage::State {
                term,
                vote,
                commit,
                truncated_index,
                truncated_term,
                voters,
                learners,
                voters_outgoing,
            } => {
                let Some((name, bytes)) = files.last_mut() else {
                    continue;
                };
                let Some((mut ti, mut tt, mut hs, mut cs)) =
                    (name == "state").then(|| decode_state(bytes)).flatten()
                else {
                    continue;
                };
                let set = |value: &mut u64, num: &Option<Num>| {
                    if let Some(num) = num {
                        *value = num.apply(*value);
                    }
                };
                set(&mut hs.term, term);
                set(&mut hs.vote, vote);
                set(&mut hs.commit, commit);
                set(&mut ti, truncated_index);
                set(&mut tt, truncated_term);
                if let Some(v) = voters {
                    cs.set_voters(ids(v));
                }
                if let Some(v) = learners {
                    cs.set_learners(ids(v));
                }
                if let Some(v) = voters_outgoing {
                    cs.set_voters_outgoing(ids(v));
                }
                *bytes = encode_state(ti, tt, &hs, &cs);
            }
            Damage::Remove { file } => {
                files.remove(*file as usize % files.len());
            }
            Damage::Rename { file, first_index } => {
                let Some(file) = segment(&files, *file) else {
                    continue;
                };
                let name = &mut files[file].0;
                let first: u64 = name.trim_end_matches(".seg").parse().unwrap_or(0);
                *name = format!("{:020}.seg", first_index.apply(first));
            }
        }
    }
    files
}

/// Opens the damaged log: the error of the first open, or None if it opened — then the node
/// took a proposal (or refused it) and the log it left opened again.
fn open_damaged(input: Input) -> Option<RaftError> {
    let log = valid_log();
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    std::fs::create_dir_all(&wal).unwrap();
    for (name, bytes) in damaged(log.files.clone(), &input.damage) {
        std::fs::write(wal.join(name), bytes).unwrap();
    }
    let durable = input.durable.apply(log.durable);
    within(Duration::from_secs(10), move || {
        let runtime = runtime();
        for _ in 0..2 {
            let node = match RaftNode::open(config(&wal), Sink::new(durable)) {
                Ok(node) => node,
                Err(
                    e @ (RaftError::Corruption(_) | RaftError::Encoding(_) | RaftError::Raft(_)),
                ) => return Some(e),
                Err(e) => panic!("not an error about the log: {e}"),
            };
            let proposal = node.propose(b"after".to_vec());
            let wait = async { tokio::time::timeout(Duration::from_secs(2), proposal).await };
            let _ = runtime.block_on(wait);
        }
        drop(dir);
        None
    })
}

#[test]
fn fuzz_damaged_logs_open_or_fail_cleanly() {
    Fuzz::new("raft_log", 1000)
        .watch_threads(&["raft-"])
        .run(input, |input| {
            open_damaged(input);
        });
}

/// The state file with another membership (ids are taken modulo 5).
fn membership(voters: &[u8], learners: &[u8]) -> Damage {
    Damage::State {
        term: None,
        vote: None,
        commit: None,
        truncated_index: None,
        truncated_term: None,
        voters: Some(voters.to_vec()),
        learners: Some(learners.to_vec()),
        voters_outgoing: None,
    }
}

/// What the fuzz test found, shrunk: each input was a panic or a hang, now an error that says
/// what is wrong (or, for the last, a node that opens).
#[test]
fn fuzz_findings_fail_cleanly() {
    let error = |durable, damage| {
        let input = Input { durable, damage };
        open_damaged(input)
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    // The first segment gone: a gap after the truncation point (MemStorage panicked on it).
    let found = error(Num::Near(0), vec![Damage::Remove { file: 0 }]);
    assert!(found.contains("gap in the log"), "{found}");
    // The state machine durable beyond the end of the log (raft-rs: "hs.commit out of range").
    let found = error(Num::Any(1 << 58), vec![]);
    assert!(found.contains("but the log ends at"), "{found}");
    // A member both voter and learner, and a member 0 (raft-rs: "invalid restore").
    for damage in [membership(&[1, 4], &[4]), membership(&[4, 0], &[2])] {
        let found = error(Num::Near(0), vec![damage]);
        assert!(
            found.contains("a membership Nyala does not write"),
            "{found}"
        );
    }
    // The one voter is another node: opening campaigned for ever; now it opens as a follower.
    assert!(error(Num::Near(0), vec![membership(&[4], &[])]).is_empty());
}
