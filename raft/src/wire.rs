//! The protobuf encoding of raft-rs's messages, by prost rather than by rust-protobuf.
//!
//! Why it exists: raft-rs 0.7 generates its `eraftpb` types with rust-protobuf 2, and
//! RUSTSEC-2024-0437 (uncontrolled recursion, a stack overflow on crafted input) covers every
//! rust-protobuf release before 3.7.2, which raft-rs cannot use. Nyala decodes Raft messages that
//! arrive from the network (the internal RPC port), where one crafted packet must not be able to
//! abort a server. (Reading 2.28's code, its skipping of unknown groups looks non-recursive, but
//! Nyala does not rest on that reading.) The structs here mirror `eraftpb.proto` of raft-proto
//! 0.7.0 field for field (same numbers, same types), and every byte Nyala encodes or decodes goes
//! through them; the `eraftpb` types remain what raft-rs is driven with, converted with the
//! `From`/`TryFrom` impls below. prost's decoder bounds nesting (messages and groups alike) by
//! its recursion limit of 100 and fails with an error beyond it. Nothing may turn on prost's
//! `no-recursion-limit` feature. (raft-rs itself still parses one thing with rust-protobuf: a
//! leader parses the `ConfChange` in the entries of a `MsgPropose` it is sent.)
//!
//! Compatibility: it is the same wire format, so whatever rust-protobuf wrote reads here and the
//! other way round (log segments and state files written before this module, and peers running
//! an older Nyala). What the log stores is even byte for byte what rust-protobuf writes (`Entry`,
//! `HardState`, `ConfState`; repeated numbers are unpacked, as rust-protobuf writes them). The one
//! difference: prost writes a message's fields in order of their numbers, rust-protobuf in the
//! order the .proto declares them, which differ for `Message` (`commit_term` = 15 comes after
//! `commit` = 8, `request_snapshot` = 13 before `reject` = 10), `ConfChange` (`id` = 1 last) and
//! `Entry` (`context` = 6 before the deprecated `sync_log` = 5, which raft-rs never sets).
//! Protobuf parsers accept fields in any order, rust-protobuf's included.
//!
//! Decoding is strict where rust-protobuf was lenient: an enum value this version does not know
//! (a message type, an entry type, a change type) is an error instead of the default value.
//! Unknown fields are skipped (rust-protobuf kept them; raft-rs never looks at them).
//! `ConfChangeV2` is not mirrored: Nyala proposes single changes only (`ConfChange`).

use prost::bytes::Bytes;
use prost::Message as _;
use raft::eraftpb;

use crate::RaftError;

/// An `eraftpb` type and its mirror here.
pub(crate) trait Wire: Sized + TryFrom<<Self as Wire>::Mirror, Error = RaftError> {
    type Mirror: prost::Message + Default + for<'a> From<&'a Self>;
}

/// `value` in protobuf encoding.
pub(crate) fn encode<T: Wire>(value: &T) -> Vec<u8> {
    T::Mirror::from(value).encode_to_vec()
}

/// [`encode`], appended to `out`.
pub(crate) fn encode_into<T: Wire>(value: &T, out: &mut Vec<u8>) {
    let mirror = T::Mirror::from(value);
    out.reserve(mirror.encoded_len());
    // A Vec grows as needed, so encoding into it cannot fail.
    let _ = mirror.encode(out);
}

/// The value [`encode`] (or rust-protobuf) encoded.
pub(crate) fn decode<T: Wire>(bytes: &[u8]) -> Result<T, RaftError> {
    T::try_from(T::Mirror::decode(bytes)?)
}

/// The enum value `value` of a field `what`; one this version does not know is an error.
fn known<E: TryFrom<i32>>(value: i32, what: &str) -> Result<E, RaftError> {
    E::try_from(value).map_err(|_| RaftError::Encoding(format!("unknown {what} {value}")))
}

/// A protobuf enum of `eraftpb`, mirrored variant for variant.
macro_rules! mirror_enum {
    ($name:ident { $($variant:ident = $value:literal,)* }) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        #[allow(clippy::enum_variant_names)] // eraftpb's names
        pub enum $name {
            $($variant = $value,)*
        }

        impl From<eraftpb::$name> for $name {
            fn from(value: eraftpb::$name) -> Self {
                match value {
                    $(eraftpb::$name::$variant => Self::$variant,)*
                }
            }
        }

        impl From<$name> for eraftpb::$name {
            fn from(value: $name) -> Self {
                match value {
                    $($name::$variant => Self::$variant,)*
                }
            }
        }
    };
}

mirror_enum!(EntryType {
    EntryNormal = 0,
    EntryConfChange = 1,
    EntryConfChangeV2 = 2,
});

mirror_enum!(MessageType {
    MsgHup = 0,
    MsgBeat = 1,
    MsgPropose = 2,
    MsgAppend = 3,
    MsgAppendResponse = 4,
    MsgRequestVote = 5,
    MsgRequestVoteResponse = 6,
    MsgSnapshot = 7,
    MsgHeartbeat = 8,
    MsgHeartbeatResponse = 9,
    MsgUnreachable = 10,
    MsgSnapStatus = 11,
    MsgCheckQuorum = 12,
    MsgTransferLeader = 13,
    MsgTimeoutNow = 14,
    MsgReadIndex = 15,
    MsgReadIndexResp = 16,
    MsgRequestPreVote = 17,
    MsgRequestPreVoteResponse = 18,
});

mirror_enum!(ConfChangeType {
    AddNode = 0,
    RemoveNode = 1,
    AddLearnerNode = 2,
});

#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(enumeration = "EntryType", tag = "1")]
    pub entry_type: i32,
    #[prost(uint64, tag = "2")]
    pub term: u64,
    #[prost(uint64, tag = "3")]
    pub index: u64,
    #[prost(bytes = "bytes", tag = "4")]
    pub data: Bytes,
    #[prost(bytes = "bytes", tag = "6")]
    pub context: Bytes,
    /// Deprecated in eraftpb, kept for compatibility.
    #[prost(bool, tag = "5")]
    pub sync_log: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotMetadata {
    #[prost(message, optional, tag = "1")]
    pub conf_state: Option<ConfState>,
    #[prost(uint64, tag = "2")]
    pub index: u64,
    #[prost(uint64, tag = "3")]
    pub term: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Snapshot {
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<SnapshotMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Message {
    #[prost(enumeration = "MessageType", tag = "1")]
    pub msg_type: i32,
    #[prost(uint64, tag = "2")]
    pub to: u64,
    #[prost(uint64, tag = "3")]
    pub from: u64,
    #[prost(uint64, tag = "4")]
    pub term: u64,
    #[prost(uint64, tag = "5")]
    pub log_term: u64,
    #[prost(uint64, tag = "6")]
    pub index: u64,
    #[prost(message, repeated, tag = "7")]
    pub entries: Vec<Entry>,
    #[prost(uint64, tag = "8")]
    pub commit: u64,
    #[prost(uint64, tag = "15")]
    pub commit_term: u64,
    #[prost(message, optional, tag = "9")]
    pub snapshot: Option<Snapshot>,
    #[prost(uint64, tag = "13")]
    pub request_snapshot: u64,
    #[prost(bool, tag = "10")]
    pub reject: bool,
    #[prost(uint64, tag = "11")]
    pub reject_hint: u64,
    #[prost(bytes = "bytes", tag = "12")]
    pub context: Bytes,
    #[prost(uint64, tag = "14")]
    pub deprecated_priority: u64,
    #[prost(int64, tag = "16")]
    pub priority: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HardState {
    #[prost(uint64, tag = "1")]
    pub term: u64,
    #[prost(uint64, tag = "2")]
    pub vote: u64,
    #[prost(uint64, tag = "3")]
    pub commit: u64,
}

/// The repeated fields are unpacked (prost packs proto3 numbers by default): rust-protobuf 2
/// writes them unpacked, and so the bytes stay the same. Both forms decode.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfState {
    #[prost(uint64, repeated, packed = "false", tag = "1")]
    pub voters: Vec<u64>,
    #[prost(uint64, repeated, packed = "false", tag = "2")]
    pub learners: Vec<u64>,
    #[prost(uint64, repeated, packed = "false", tag = "3")]
    pub voters_outgoing: Vec<u64>,
    #[prost(uint64, repeated, packed = "false", tag = "4")]
    pub learners_next: Vec<u64>,
    #[prost(bool, tag = "5")]
    pub auto_leave: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfChange {
    #[prost(enumeration = "ConfChangeType", tag = "2")]
    pub change_type: i32,
    #[prost(uint64, tag = "3")]
    pub node_id: u64,
    #[prost(bytes = "bytes", tag = "4")]
    pub context: Bytes,
    #[prost(uint64, tag = "1")]
    pub id: u64,
}

// eraftpb → mirror (encoding). The `bytes` fields are `Bytes` on both sides: cloned, not copied.

impl From<&eraftpb::Entry> for Entry {
    fn from(e: &eraftpb::Entry) -> Self {
        Self {
            entry_type: EntryType::from(e.get_entry_type()) as i32,
            term: e.get_term(),
            index: e.get_index(),
            data: e.data.clone(),
            context: e.context.clone(),
            sync_log: e.get_sync_log(),
        }
    }
}

impl From<&eraftpb::SnapshotMetadata> for SnapshotMetadata {
    fn from(m: &eraftpb::SnapshotMetadata) -> Self {
        Self {
            conf_state: m
                .has_conf_state()
                .then(|| ConfState::from(m.get_conf_state())),
            index: m.get_index(),
            term: m.get_term(),
        }
    }
}

impl From<&eraftpb::Snapshot> for Snapshot {
    fn from(s: &eraftpb::Snapshot) -> Self {
        Self {
            data: s.data.clone(),
            metadata: s
                .has_metadata()
                .then(|| SnapshotMetadata::from(s.get_metadata())),
        }
    }
}

impl From<&eraftpb::Message> for Message {
    fn from(m: &eraftpb::Message) -> Self {
        Self {
            msg_type: MessageType::from(m.get_msg_type()) as i32,
            to: m.get_to(),
            from: m.get_from(),
            term: m.get_term(),
            log_term: m.get_log_term(),
            index: m.get_index(),
            entries: m.get_entries().iter().map(Entry::from).collect(),
            commit: m.get_commit(),
            commit_term: m.get_commit_term(),
            snapshot: m.has_snapshot().then(|| Snapshot::from(m.get_snapshot())),
            request_snapshot: m.get_request_snapshot(),
            reject: m.get_reject(),
            reject_hint: m.get_reject_hint(),
            context: m.context.clone(),
            deprecated_priority: m.get_deprecated_priority(),
            priority: m.get_priority(),
        }
    }
}

impl From<&eraftpb::HardState> for HardState {
    fn from(h: &eraftpb::HardState) -> Self {
        Self {
            term: h.get_term(),
            vote: h.get_vote(),
            commit: h.get_commit(),
        }
    }
}

impl From<&eraftpb::ConfState> for ConfState {
    fn from(c: &eraftpb::ConfState) -> Self {
        Self {
            voters: c.get_voters().to_vec(),
            learners: c.get_learners().to_vec(),
            voters_outgoing: c.get_voters_outgoing().to_vec(),
            learners_next: c.get_learners_next().to_vec(),
            auto_leave: c.get_auto_leave(),
        }
    }
}

impl From<&eraftpb::ConfChange> for ConfChange {
    fn from(c: &eraftpb::ConfChange) -> Self {
        Self {
            change_type: ConfChangeType::from(c.get_change_type()) as i32,
            node_id: c.get_node_id(),
            context: c.context.clone(),
            id: c.get_id(),
        }
    }
}

// Mirror → eraftpb (decoding): fails only on enum values this version does not know.

impl TryFrom<Entry> for eraftpb::Entry {
    type Error = RaftError;
    fn try_from(e: Entry) -> Result<Self, RaftError> {
        let mut out = eraftpb::Entry::default();
        out.set_entry_type(known::<EntryType>(e.entry_type, "entry type")?.into());
        out.set_term(e.term);
        out.set_index(e.index);
        out.set_data(e.data);
        out.set_context(e.context);
        out.set_sync_log(e.sync_log);
        Ok(out)
    }
}

impl TryFrom<SnapshotMetadata> for eraftpb::SnapshotMetadata {
    type Error = RaftError;
    fn try_from(m: SnapshotMetadata) -> Result<Self, RaftError> {
        let mut out = eraftpb::SnapshotMetadata::default();
        if let Some(conf_state) = m.conf_state {
            out.set_conf_state(conf_state.try_into()?);
        }
        out.set_index(m.index);
        out.set_term(m.term);
        Ok(out)
    }
}

impl TryFrom<Snapshot> for eraftpb::Snapshot {
    type Error = RaftError;
    fn try_from(s: Snapshot) -> Result<Self, RaftError> {
        let mut out = eraftpb::Snapshot::default();
        out.set_data(s.data);
        if let Some(metadata) = s.metadata {
            out.set_metadata(metadata.try_into()?);
        }
        Ok(out)
    }
}

impl TryFrom<Message> for eraftpb::Message {
    type Error = RaftError;
    fn try_from(m: Message) -> Result<Self, RaftError> {
        let mut out = eraftpb::Message::default();
        out.set_msg_type(known::<MessageType>(m.msg_type, "message type")?.into());
        out.set_to(m.to);
        out.set_from(m.from);
        out.set_term(m.term);
        out.set_log_term(m.log_term);
        out.set_index(m.index);
        let entries = m.entries.into_iter().map(TryInto::try_into);
        out.set_entries(entries.collect::<Result<Vec<_>, _>>()?.into());
        out.set_commit(m.commit);
        out.set_commit_term(m.commit_term);
        if let Some(snapshot) = m.snapshot {
            out.set_snapshot(snapshot.try_into()?);
        }
        out.set_request_snapshot(m.request_snapshot);
        out.set_reject(m.reject);
        out.set_reject_hint(m.reject_hint);
        out.set_context(m.context);
        out.set_deprecated_priority(m.deprecated_priority);
        out.set_priority(m.priority);
        Ok(out)
    }
}

impl TryFrom<HardState> for eraftpb::HardState {
    type Error = RaftError;
    fn try_from(h: HardState) -> Result<Self, RaftError> {
        let mut out = eraftpb::HardState::default();
        out.set_term(h.term);
        out.set_vote(h.vote);
        out.set_commit(h.commit);
        Ok(out)
    }
}

impl TryFrom<ConfState> for eraftpb::ConfState {
    type Error = RaftError;
    fn try_from(c: ConfState) -> Result<Self, RaftError> {
        let mut out = eraftpb::ConfState::default();
        out.set_voters(c.voters);
        out.set_learners(c.learners);
        out.set_voters_outgoing(c.voters_outgoing);
        out.set_learners_next(c.learners_next);
        out.set_auto_leave(c.auto_leave);
        Ok(out)
    }
}

impl TryFrom<ConfChange> for eraftpb::ConfChange {
    type Error = RaftError;
    fn try_from(c: ConfChange) -> Result<Self, RaftError> {
        let mut out = eraftpb::ConfChange::default();
        out.set_change_type(known::<ConfChangeType>(c.change_type, "conf change type")?.into());
        out.set_node_id(c.node_id);
        out.set_context(c.context);
        out.set_id(c.id);
        Ok(out)
    }
}

impl Wire for eraftpb::Entry {
    type Mirror = Entry;
}
impl Wire for eraftpb::Message {
    type Mirror = Message;
}
impl Wire for eraftpb::HardState {
    type Mirror = HardState;
}
impl Wire for eraftpb::ConfState {
    type Mirror = ConfState;
}
impl Wire for eraftpb::ConfChange {
    type Mirror = ConfChange;
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// rust-protobuf's encoding: what raft-rs and Nyala before this module wrote.
    fn rust_protobuf_bytes(value: &impl protobuf::Message) -> Vec<u8> {
        value.write_to_bytes().unwrap()
    }

    fn rust_protobuf_parse<T: protobuf::Message>(bytes: &[u8]) -> T {
        T::parse_from_bytes(bytes).unwrap()
    }

    /// Mostly zero (proto3 leaves the field out), otherwise small or large.
    fn number(rng: &mut StdRng) -> u64 {
        match rng.random_range(0..4) {
            0 => 0,
            1 => rng.random_range(1..300),
            2 => rng.random(),
            _ => u64::MAX,
        }
    }

    fn bytes(rng: &mut StdRng) -> Bytes {
        let len = match rng.random_range(0..4) {
            0 => 0,
            1 => rng.random_range(1..16),
            2 => rng.random_range(100..300),
            _ => rng.random_range(0..5000),
        };
        (0..len)
            .map(|_| rng.random::<u8>())
            .collect::<Vec<_>>()
            .into()
    }

    fn numbers(rng: &mut StdRng) -> Vec<u64> {
        (0..rng.random_range(0..6)).map(|_| number(rng)).collect()
    }

    fn entry(rng: &mut StdRng) -> eraftpb::Entry {
        let mut e = eraftpb::Entry::default();
        e.set_entry_type(
            known::<EntryType>(rng.random_range(0..3), "entry type")
                .unwrap()
                .into(),
        );
        e.set_term(number(rng));
        e.set_index(number(rng));
        e.set_data(bytes(rng));
        e.set_context(bytes(rng));
        e.set_sync_log(rng.random_bool(0.2));
        e
    }

    fn conf_state(rng: &mut StdRng) -> eraftpb::ConfState {
        let mut c = eraftpb::ConfState::default();
        c.set_voters(numbers(rng));
        c.set_learners(numbers(rng));
        c.set_voters_outgoing(numbers(rng));
        c.set_learners_next(numbers(rng));
        c.set_auto_leave(rng.random_bool(0.5));
        c
    }

    fn message(rng: &mut StdRng) -> eraftpb::Message {
        let mut m = eraftpb::Message::default();
        m.set_msg_type(
            known::<MessageType>(rng.random_range(0..19), "message type")
                .unwrap()
                .into(),
        );
        m.set_to(number(rng));
        m.set_from(number(rng));
        m.set_term(number(rng));
        m.set_log_term(number(rng));
        m.set_index(number(rng));
        for _ in 0..rng.random_range(0..5) {
            m.mut_entries().push(entry(rng));
        }
        m.set_commit(number(rng));
        m.set_commit_term(number(rng));
        if rng.random_bool(0.5) {
            let mut s = eraftpb::Snapshot::default();
            s.set_data(bytes(rng));
            if rng.random_bool(0.8) {
                let mut meta = eraftpb::SnapshotMetadata::default();
                if rng.random_bool(0.8) {
                    meta.set_conf_state(conf_state(rng));
                }
                meta.set_index(number(rng));
                meta.set_term(number(rng));
                s.set_metadata(meta);
            }
            m.set_snapshot(s);
        }
        m.set_request_snapshot(number(rng));
        m.set_reject(rng.random_bool(0.5));
        m.set_reject_hint(number(rng));
        m.set_context(bytes(rng));
        m.set_deprecated_priority(number(rng));
        m.set_priority(number(rng) as i64);
        m
    }

    fn conf_change(rng: &mut StdRng) -> eraftpb::ConfChange {
        let mut c = eraftpb::ConfChange::default();
        c.set_change_type(
            known::<ConfChangeType>(rng.random_range(0..3), "conf change type")
                .unwrap()
                .into(),
        );
        c.set_node_id(number(rng));
        c.set_context(bytes(rng));
        c.set_id(number(rng));
        c
    }

    /// Both ways: rust-protobuf's bytes decode here to the same value, ours decode with
    /// rust-protobuf to the same value; the encodings have the same length (same fields, same
    /// packing) and, if `same_bytes`, are the same bytes.
    fn check<T>(value: &T, same_bytes: bool)
    where
        T: Wire + protobuf::Message + PartialEq + std::fmt::Debug,
        T::Mirror: PartialEq + std::fmt::Debug,
    {
        let theirs = rust_protobuf_bytes(value);
        let ours = encode(value);
        assert_eq!(&decode::<T>(&theirs).unwrap(), value);
        assert_eq!(&rust_protobuf_parse::<T>(&ours), value);
        assert_eq!(ours.len(), theirs.len(), "{value:?}");
        if same_bytes {
            assert_eq!(ours, theirs, "{value:?}");
        }
        // The mirror decoded from rust-protobuf's bytes is the mirror of the value.
        assert_eq!(
            T::Mirror::decode(theirs.as_slice()).unwrap(),
            T::Mirror::from(value)
        );
    }

    #[test]
    fn randomized_values_cross_rust_protobuf_both_ways() {
        let mut rng = StdRng::seed_from_u64(0x5eed_2024_0437);
        for _ in 0..2000 {
            let m = message(&mut rng);
            check(&m, false);
            for e in m.get_entries() {
                // What the log stores: the same bytes (sync_log aside, written in another order).
                check(e, !e.get_sync_log() || e.get_context().is_empty());
            }
            let cs = conf_state(&mut rng);
            check(&cs, true);
            let mut hs = eraftpb::HardState::default();
            hs.set_term(number(&mut rng));
            hs.set_vote(number(&mut rng));
            hs.set_commit(number(&mut rng));
            check(&hs, true);
            let cc = conf_change(&mut rng);
            check(&cc, cc.get_id() == 0);
        }
    }

    #[test]
    fn empty_and_default_values() {
        check(&eraftpb::Message::default(), true);
        check(&eraftpb::Entry::default(), true);
        check(&eraftpb::HardState::default(), true);
        check(&eraftpb::ConfState::default(), true);
        check(&eraftpb::ConfChange::default(), true);
        // A present but empty snapshot stays present.
        let mut m = eraftpb::Message::default();
        m.mut_snapshot().mut_metadata().mut_conf_state();
        check(&m, true);
        assert!(decode::<eraftpb::Message>(&encode(&m))
            .unwrap()
            .get_snapshot()
            .get_metadata()
            .has_conf_state());
    }

    /// Proposals and raft-rs's local messages are not accepted from another server.
    #[test]
    fn only_messages_between_servers_are_received() {
        let mut m = eraftpb::Message::default();
        m.set_msg_type(eraftpb::MessageType::MsgPropose);
        m.mut_entries().push(eraftpb::Entry::default());
        let refused = crate::decode_message(&encode(&m)).unwrap_err();
        assert!(refused.to_string().contains("MsgPropose"), "{refused}");
        m.set_msg_type(eraftpb::MessageType::MsgAppend);
        assert!(crate::decode_message(&encode(&m)).is_ok());
    }

    /// What raft-rs's `propose_conf_change` puts in an entry (rust-protobuf encoding) decodes.
    #[test]
    fn conf_change_written_by_raft_rs_decodes() {
        let mut cc = eraftpb::ConfChange::default();
        cc.set_change_type(eraftpb::ConfChangeType::AddLearnerNode);
        cc.set_node_id(4);
        cc.set_context(b"10.0.0.4:7051".to_vec().into());
        cc.set_id(7);
        let data = rust_protobuf_bytes(&cc);
        assert_eq!(decode::<eraftpb::ConfChange>(&data).unwrap(), cc);
    }

    #[test]
    fn unknown_enum_values_are_errors() {
        // Message.msg_type = 19, Entry.entry_type = 3, ConfChange.change_type = 127.
        let err = decode::<eraftpb::Message>(&[0x08, 0x13]).unwrap_err();
        assert!(err.to_string().contains("unknown message type 19"), "{err}");
        let err = decode::<eraftpb::Entry>(&[0x08, 0x03]).unwrap_err();
        assert!(err.to_string().contains("unknown entry type 3"), "{err}");
        let err = decode::<eraftpb::ConfChange>(&[0x10, 0x7f]).unwrap_err();
        assert!(
            err.to_string().contains("unknown conf change type 127"),
            "{err}"
        );
        // In an entry of a message, too: entries = [{ term = 1 }] → [{ term = 1, entry_type = 9 }].
        let mut m = eraftpb::Message::default();
        m.mut_entries().push(eraftpb::Entry::default());
        m.mut_entries()[0].set_term(1);
        let mut bytes = encode(&m);
        assert_eq!(bytes, [0x3a, 0x02, 0x10, 0x01]);
        bytes[1] = 0x04;
        bytes.extend_from_slice(&[0x08, 0x09]);
        let err = crate::decode_message(&bytes).unwrap_err();
        assert!(err.to_string().contains("unknown entry type 9"), "{err}");
    }

    /// Crafted input of the kind RUSTSEC-2024-0437 is about (groups nested without end) fails
    /// with an error, on a small stack: prost bounds nesting by its recursion limit.
    #[test]
    fn deeply_nested_garbage_is_an_error_not_a_stack_overflow() {
        let handle = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                // 100 000 bytes each; errors whatever type they are decoded as.
                let garbage: [(&str, Vec<u8>); 3] = [
                    // The start of a group in unknown field 20, 50 000 times nested.
                    ("nested unknown groups", [0xa3, 0x01].repeat(50_000)),
                    // The start of a group in field 9 (Message.snapshot, a message), repeated.
                    ("groups in field 9", [0x4b].repeat(100_000)),
                    // Field 9 (Message.snapshot; unknown elsewhere), length-delimited, repeated,
                    // each claiming 65 535 bytes.
                    ("nested lengths", [0x4a, 0xff, 0xff, 0x03].repeat(25_000)),
                ];
                for (what, bytes) in &garbage {
                    assert!(crate::decode_message(bytes).is_err(), "{what}");
                    assert!(decode::<eraftpb::Entry>(bytes).is_err(), "{what}");
                    assert!(decode::<eraftpb::HardState>(bytes).is_err(), "{what}");
                    assert!(decode::<eraftpb::ConfState>(bytes).is_err(), "{what}");
                    assert!(decode::<eraftpb::ConfChange>(bytes).is_err(), "{what}");
                }
                // Groups nested 40 000 deep inside a well-formed snapshot → metadata.
                let groups = [0xa3, 0x01].repeat(40_000);
                let metadata = [vec![0x12], varint(groups.len()), groups].concat();
                let snapshot = [vec![0x4a], varint(metadata.len()), metadata].concat();
                assert!(crate::decode_message(&snapshot).is_err());
                // Entries nested 25 000 deep in entries (field 7, unknown in an entry): the outer
                // entry skips the field whole, without descending into it, so it decodes.
                let entries = nested(0x3a, 25_000, &[0xa3, 0x01]);
                assert!(entries.len() > 80_000);
                assert_eq!(
                    decode::<eraftpb::Message>(&entries)
                        .unwrap()
                        .get_entries()
                        .len(),
                    1
                );
            })
            .unwrap();
        handle
            .join()
            .expect("decoding crafted input must not crash");
    }

    fn varint(mut n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
        out
    }

    /// `depth` length-delimited fields with key `key`, each inside the one before, around `inner`.
    fn nested(key: u8, depth: usize, inner: &[u8]) -> Vec<u8> {
        let mut lengths = Vec::with_capacity(depth);
        let mut len = inner.len();
        for _ in 0..depth {
            lengths.push(len);
            len += 1 + varint(len).len();
        }
        let mut out = Vec::with_capacity(len);
        for &len in lengths.iter().rev() {
            out.push(key);
            out.extend(varint(len));
        }
        out.extend_from_slice(inner);
        out
    }
}
