//! Nyala's Raft layer: raft-rs `RawNode`s whose log is durable on disk and doubles as the WAL.
//!
//! The layer replicates opaque, deterministic commands. A user of it implements
//! [`StateMachine`] (apply a committed command; tell how far its own files are durable) and
//! proposes commands through a [`RaftNode`]; a proposal resolves with the state machine's output
//! once the entry is durable, committed and applied. On open, committed entries after the state
//! machine's durable index are replayed, exactly once, before any new proposal.
//!
//! - [`log`](crate::log): segment files with checksums, the hard-state file, truncation.
//! - [`node`](crate::node): the ready loop, in one place.
//! - `wire`: the protobuf encoding of raft-rs's messages by prost (rust-protobuf 2, which raft-rs's
//!   own types use, is under RUSTSEC-2024-0437: Nyala does not parse with it).
//!
//! A group has one voter (the embedded single node, which elects itself at once) or several
//! (one per server holding a replica): messages to peers go out through a [`Transport`], and
//! messages from them come in through [`RaftNode::step`].

use std::path::PathBuf;

mod log;
mod node;
mod wire;

pub use node::{Checkpoint, GroupState, RaftNode, Transport};
pub use raft::eraftpb::Message;

/// The replicated state machine a Raft group drives.
pub trait StateMachine: Send + 'static {
    type Output: Send + 'static;
    /// Index of the last log entry whose effects are durable in the state machine's own files.
    /// On open, committed entries after it are replayed through `apply`; log segments wholly at
    /// or below it may be deleted.
    fn durable_index(&self) -> u64;
    /// Applies a committed command. Must be deterministic: it may depend only on the state and
    /// the command. Called on the Raft thread, in log order, once per entry per process lifetime.
    /// `command` shares the entry's memory (what was proposed, on the node that proposed it),
    /// so the state machine may keep parts of it without a copy.
    fn apply(&mut self, index: u64, command: &bytes::Bytes) -> Self::Output;
    /// Called after a membership change applied: the new voters and learners, and the
    /// change's context (what its proposer attached, e.g. a new member's address).
    fn membership_changed(&mut self, _voters: &[u64], _learners: &[u64], _context: &[u8]) {}
}

/// A change of a group's membership: one at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// A new non-voting member that receives the log.
    AddLearner(u64),
    /// A learner (or new node) becomes a voter.
    AddVoter(u64),
    Remove(u64),
}

/// Creates the empty log of a replica copied from another at entry `index` of term `term`,
/// in a group of `voters` and `learners` (see [`RaftNode::open_with_transport`] to open it).
pub fn create_log_at(
    log_dir: &std::path::Path,
    index: u64,
    term: u64,
    voters: Vec<u64>,
    learners: Vec<u64>,
) -> Result<(), RaftError> {
    let mut conf = raft::eraftpb::ConfState::default();
    conf.set_voters(voters);
    conf.set_learners(learners);
    log::DurableLog::create_at(log_dir, index, term, conf, true)
}

#[derive(Debug, Clone)]
pub struct RaftConfig {
    pub node_id: u64,
    pub log_dir: PathBuf,
    /// The voters of a new group (used only when the log is created); empty: this node alone.
    pub voters: Vec<u64>,
    /// Size at which the log rolls to a new segment file.
    pub segment_bytes: u64,
    /// fsync appends and state changes (turn off only in tests that simulate nothing durable).
    pub sync: bool,
    /// The Raft clock: heartbeats go out every `heartbeat_ticks` ticks, and a follower that
    /// hears nothing for a random time between `election_ticks` and twice that campaigns.
    pub tick: std::time::Duration,
    pub heartbeat_ticks: usize,
    pub election_ticks: usize,
    /// Followers learn that entries committed from the next append or heartbeat, not from a
    /// round of messages after every commit (raft-rs's `skip_bcast_commit`): right for a group
    /// whose followers nobody reads; one whose followers serve reads turns it off.
    pub lazy_commit_broadcast: bool,
}

impl RaftConfig {
    /// A single-voter group, or the member `node_id` of a new group of `voters` (500 ms
    /// heartbeats, elections after 1.5 to 3 s of silence).
    pub fn new(node_id: u64, log_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_id,
            log_dir: log_dir.into(),
            voters: Vec::new(),
            // Small enough that a flushed tablet soon drops the segments behind its flush.
            segment_bytes: 8 << 20,
            sync: true,
            tick: std::time::Duration::from_millis(100),
            heartbeat_ticks: 5,
            election_ticks: 15,
            lazy_commit_broadcast: true,
        }
    }

    pub fn with_voters(self, voters: Vec<u64>) -> Self {
        Self { voters, ..self }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    #[error("log I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("log corrupted: {0}")]
    Corruption(String),
    #[error("not the leader (leader hint: {leader_hint:?})")]
    NotLeader { leader_hint: Option<u64> },
    #[error("the replica is stopped")]
    Stopped,
    #[error("{0}")]
    Busy(String),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// Bytes that are not a valid encoding (of a message, a log entry, the log's state).
    #[error("raft encoding: {0}")]
    Encoding(String),
}

impl From<prost::DecodeError> for RaftError {
    fn from(e: prost::DecodeError) -> Self {
        RaftError::Encoding(e.to_string())
    }
}

/// A Raft message as bytes, for a transport between processes (protobuf; see the `wire` module).
pub fn encode_message(message: &Message) -> Result<Vec<u8>, RaftError> {
    Ok(wire::encode(message))
}

/// The message [`encode_message`] (or raft-rs's rust-protobuf encoding) encoded, as received
/// from another server. Crafted input fails with an error: decoding is bounded (see the `wire`
/// module). Messages that never travel between Nyala's servers are refused: the local ones
/// (raft-rs's own ticks and reports), and proposals, which only a leader takes (a follower
/// answers NotLeader instead of forwarding) — so raft-rs never parses a proposed membership
/// change from the network with rust-protobuf.
pub fn decode_message(bytes: &[u8]) -> Result<Message, RaftError> {
    use raft::eraftpb::MessageType;
    let message: Message = wire::decode(bytes)?;
    match message.get_msg_type() {
        MessageType::MsgHup
        | MessageType::MsgBeat
        | MessageType::MsgPropose
        | MessageType::MsgUnreachable
        | MessageType::MsgSnapStatus
        | MessageType::MsgCheckQuorum => Err(RaftError::Encoding(format!(
            "{:?} is not a message between servers",
            message.get_msg_type()
        ))),
        _ => Ok(message),
    }
}
