//! The Raft node: one thread per group runs raft-rs's ready loop over the durable log.
//!
//! All of a group's work happens on its thread, in one loop: take every queued request
//! (proposals are batched, so concurrent writers share one fsync), tick, then handle the ready —
//! persist entries and hard state → send messages → apply committed entries → advance → apply
//! what the light ready committed. Afterwards the log is truncated up to what the state machine
//! reports durable. Callers talk to the thread through a channel; a proposal is enqueued when
//! [`RaftNode::propose`] is called (not when its future is first polled), so callers can order
//! their proposals by holding a lock around the call.
//!
//! The thread sleeps until there is something to do. A request wakes it (a proposal, a peer's
//! message, work for the state machine, a flush that lets the log go); otherwise it wakes only
//! when the Raft clock reaches a tick that acts: a leader's next heartbeat or quorum check, a
//! voter's election timeout. The ticks in between only count, so they are not run one by one
//! as they fall due: the thread applies those it slept through when it wakes, before the
//! requests that woke it, and the clock keeps the same time as one that ticked every
//! [`RaftConfig::tick`]. A leader without other members acts on no tick (no heartbeats to send,
//! no quorum to check), nor does a learner (it never campaigns): their threads do not wake at
//! all while nothing is asked of them. So an idle single-node group costs nothing, and an idle
//! replicated one wakes once per heartbeat on each member.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use raft::eraftpb::{ConfChange, ConfChangeType, Entry, EntryType, Message};
use raft::storage::MemStorage;
use raft::{Config, RawNode, StateRole};
use tokio::sync::oneshot;

use crate::log::DurableLog;
use crate::{wire, MembershipChange, RaftConfig, RaftError, StateMachine};

/// Entries a follower keeps beyond what its state machine made durable, for peers that lag
/// behind should it become leader (until tablet copy lets a peer catch up from a snapshot).
const FOLLOWER_LOG_RETENTION: u64 = 1000;

/// Delivers Raft messages to peers (each message names its destination in `to`). It must not
/// block: delivery is asynchronous and may lose messages, which Raft retries. Single-voter groups
/// send none.
pub trait Transport: Send + 'static {
    fn send(&self, messages: Vec<Message>);
}

/// The transport of a group without peers.
struct NoPeers;

impl Transport for NoPeers {
    fn send(&self, messages: Vec<Message>) {
        if !messages.is_empty() {
            tracing::warn!(
                count = messages.len(),
                "dropping raft messages: this group has no peers"
            );
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, RaftError>>;

enum Request<SM: StateMachine> {
    Propose {
        command: Vec<u8>,
        reply: Reply<SM::Output>,
    },
    ChangeMembership {
        change: MembershipChange,
        context: Vec<u8>,
        reply: Reply<()>,
    },
    Step(Message),
    /// Confirm that this node still leads (Raft's ReadIndex); answered with the read index
    /// once it is applied here.
    ReadIndex(Reply<u64>),
    /// Hand leadership to a member (on the leader).
    TransferLeadership(u64),
    Run(Box<dyn FnOnce(&mut SM) + Send>),
    Checkpoint(CheckpointFn<SM>),
    /// The state machine made more entries durable: the log before them can go.
    Flushed,
    Stop,
}

type CheckpointFn<SM> = Box<dyn FnOnce(&mut SM, &dyn Fn(u64) -> Checkpoint) + Send>;

/// What a copy of the state machine's files taken on the Raft thread corresponds to.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The entry the state machine's files are durable up to, and its term.
    pub index: u64,
    pub term: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

/// A group as one node sees it, as of its last ready.
#[derive(Clone, Debug, Default)]
pub struct GroupState {
    pub leader: u64,
    pub term: u64,
    pub commit: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// On the leader: how far each member's log matches its own.
    pub matched: Vec<(u64, u64)>,
    /// On the leader: the members it has not heard from within the last election timeout.
    pub inactive: Vec<u64>,
}

/// Handle to a Raft group's thread. Dropping it stops the thread.
pub struct RaftNode<SM: StateMachine> {
    requests: mpsc::Sender<Request<SM>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    last_applied: Arc<AtomicU64>,
    /// The leader this node knows of (0: none), as of its last ready.
    leader: Arc<AtomicU64>,
    state: Arc<Mutex<GroupState>>,
    log_bytes: Arc<AtomicU64>,
    id: u64,
}

impl<SM: StateMachine> RaftNode<SM> {
    /// Opens (or creates, as a single-voter group of `config.node_id`) the log, replays committed
    /// entries after `sm.durable_index()` into `sm`, and becomes leader. Returns when the node
    /// accepts proposals.
    pub fn open(config: RaftConfig, sm: SM) -> Result<Self, RaftError> {
        Self::open_with_transport(config, sm, Box::new(NoPeers))
    }

    /// Opens (or creates, with `config.voters`) the log and replays committed entries after
    /// `sm.durable_index()` into `sm`. A group of one voter becomes leader before this returns;
    /// in a larger group the node joins as a follower, sends through `transport`, and takes
    /// messages from [`Self::step`]; elections follow.
    pub fn open_with_transport(
        config: RaftConfig,
        sm: SM,
        transport: Box<dyn Transport>,
    ) -> Result<Self, RaftError> {
        let voters = match config.voters.is_empty() {
            true => vec![config.node_id],
            false => config.voters.clone(),
        };
        let mut log =
            DurableLog::open(&config.log_dir, &voters, config.segment_bytes, config.sync)?;
        let durable = sm.durable_index();
        if durable < log.truncated_index() {
            return Err(RaftError::Corruption(format!(
                "the state machine is durable up to entry {durable}, but the log was truncated up to {}",
                log.truncated_index()
            )));
        }
        if durable > log.last_index() {
            return Err(RaftError::Corruption(format!(
                "the state machine is durable up to entry {durable}, but the log ends at {}",
                log.last_index()
            )));
        }
        if log.hard_state().commit > log.last_index() {
            return Err(RaftError::Corruption(format!(
                "committed entries up to {} are missing from the log (it ends at {})",
                log.hard_state().commit,
                log.last_index()
            )));
        }
        if log.hard_state().commit < durable {
            // Applied means committed, even if the commit index had not reached the disk yet.
            log.set_commit(durable)?;
        }
        let raft_config = Config {
            id: config.node_id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied: durable,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            // A leader that cannot reach a quorum steps down; candidates first ask whether they
            // could win, so a node cut off and back does not disrupt a working leader.
            check_quorum: true,
            pre_vote: true,
            // Followers learn that entries committed from the next append or heartbeat, as in
            // Kudu, not from a round of messages of its own after every commit: under writes
            // the next append comes at once, and that extra round was a third of the messages
            // (and a busy transport for the next append). When writes stop, followers apply
            // up to a heartbeat later than the leader, so a group whose followers serve reads
            // (the masters' catalog) keeps the round.
            skip_bcast_commit: config.lazy_commit_broadcast,
            ..Default::default()
        };
        raft_config.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_config, log.storage().clone(), &logger)?;
        let last_applied = Arc::new(AtomicU64::new(durable));
        let leader = Arc::new(AtomicU64::new(0));
        let state = Arc::new(Mutex::new(GroupState::default()));
        let log_bytes = Arc::new(AtomicU64::new(0));
        // This node alone (a group whose one voter is another node waits for that node).
        let conf = raw.raft.prs().conf();
        let single = conf.voters().ids().len() == 1
            && conf.voters().contains(config.node_id)
            && conf.learners().is_empty();
        let mut worker = Worker {
            raw,
            log,
            sm,
            transport,
            pending: HashMap::new(),
            last_applied: last_applied.clone(),
            leader: leader.clone(),
            state: state.clone(),
            log_bytes: log_bytes.clone(),
            tick: config.tick,
            pending_change: None,
            failed_elections: 0,
            campaigning: false,
            reads: Reads::default(),
        };
        if single {
            worker.raw.campaign()?;
            // Replay and election: run readies until this node leads and has applied its log.
            while worker.raw.raft.state != StateRole::Leader || worker.raw.has_ready() {
                if !worker.raw.has_ready() {
                    worker.raw.tick();
                }
                worker.on_ready()?;
            }
        } else {
            // Replay what is known to be committed.
            while worker.raw.has_ready() {
                worker.on_ready()?;
            }
        }
        let (requests, inbox) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("raft-{}", config.node_id))
            .spawn(move || worker.run(inbox))?;
        Ok(Self {
            requests,
            thread: Mutex::new(Some(thread)),
            last_applied,
            leader,
            state,
            log_bytes,
            id: config.node_id,
        })
    }

    /// Proposes one membership change (on the leader); resolves once it is applied. `context`
    /// travels with it to every member's [`StateMachine::membership_changed`].
    pub fn change_membership(
        &self,
        change: MembershipChange,
        context: Vec<u8>,
    ) -> impl Future<Output = Result<(), RaftError>> + Send + 'static {
        let (reply, applied) = oneshot::channel();
        let sent = self
            .requests
            .send(Request::ChangeMembership {
                change,
                context,
                reply,
            })
            .is_ok();
        async move {
            if !sent {
                return Err(RaftError::Stopped);
            }
            applied.await.unwrap_or(Err(RaftError::Stopped))
        }
    }

    /// The group as this node sees it.
    pub fn group_state(&self) -> GroupState {
        self.state.lock().clone()
    }

    /// Runs `f` on the Raft thread between applies (say, a flush, then a copy of the files).
    /// `f` gets a function that describes the log at an index: the term of that entry and the
    /// membership, which a copy of the state machine durable up to that entry goes with.
    pub fn checkpoint<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SM, &dyn Fn(u64) -> Checkpoint) -> R + Send + 'static,
    ) -> Result<R, RaftError> {
        let (tx, rx) = mpsc::channel();
        let run: CheckpointFn<SM> = Box::new(move |sm, describe| {
            let _ = tx.send(f(sm, describe));
        });
        self.requests
            .send(Request::Checkpoint(run))
            .map_err(|_| RaftError::Stopped)?;
        rx.recv().map_err(|_| RaftError::Stopped)
    }

    /// Asks the leader to hand leadership to voter `to`: it does once `to` has caught up with
    /// its log, within an election timeout, and stops taking proposals meanwhile. Not a
    /// promise: a node that does not lead, or a `to` that is no voter, ignores it; watch
    /// [`Self::leader`] for the outcome.
    pub fn transfer_leadership(&self, to: u64) -> Result<(), RaftError> {
        self.requests
            .send(Request::TransferLeadership(to))
            .map_err(|_| RaftError::Stopped)
    }

    /// Hands the node a message from a peer (ignored once the node is stopped).
    pub fn step(&self, message: Message) {
        let _ = self.requests.send(Request::Step(message));
    }

    /// Tells the node that its state machine made more entries durable (a flush on another
    /// thread): the log before them is dropped now, not at the group's next request.
    pub fn state_machine_flushed(&self) {
        let _ = self.requests.send(Request::Flushed);
    }

    /// Bytes of this node's log on disk (what flushing the state machine lets go).
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes.load(Ordering::Relaxed)
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The leader this node knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        Some(self.leader.load(Ordering::Acquire)).filter(|&l| l != 0)
    }

    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.id)
    }

    /// Resolves once this node has confirmed, after the call, that it still leads its group
    /// (a heartbeat round answered by a majority: Raft's ReadIndex) and has applied every
    /// entry committed before that: a read of the state machine then sees every write
    /// acknowledged before the call, by this leader or any earlier one. Fails with
    /// [`RaftError::NotLeader`] on a node that does not lead or stops leading meanwhile; a
    /// leader cut off from its group answers only once it steps down (check quorum), so the
    /// caller bounds the wait.
    pub fn read_index(&self) -> impl Future<Output = Result<u64, RaftError>> + Send + 'static {
        let (reply, confirmed) = oneshot::channel();
        let sent = self.requests.send(Request::ReadIndex(reply)).is_ok();
        async move {
            if !sent {
                return Err(RaftError::Stopped);
            }
            confirmed.await.unwrap_or(Err(RaftError::Stopped))
        }
    }

    /// Proposes `command`. It is enqueued before this returns; the future resolves with the state
    /// machine's output once the entry is durable, committed and applied. An empty command is
    /// refused: empty entries are a new leader's no-ops, which are never applied.
    pub fn propose(
        &self,
        command: Vec<u8>,
    ) -> impl Future<Output = Result<SM::Output, RaftError>> + Send + 'static {
        let (reply, applied) = oneshot::channel();
        let empty = command.is_empty();
        let sent = !empty
            && self
                .requests
                .send(Request::Propose { command, reply })
                .is_ok();
        async move {
            if empty {
                return Err(RaftError::Encoding(
                    "an empty command cannot be proposed".into(),
                ));
            }
            if !sent {
                return Err(RaftError::Stopped);
            }
            applied.await.unwrap_or(Err(RaftError::Stopped))
        }
    }

    /// Runs `f` on the Raft thread with exclusive access to the state machine, between applies.
    /// Blocks the calling thread until it has run.
    pub fn with_state_machine<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SM) -> R + Send + 'static,
    ) -> Result<R, RaftError> {
        let (tx, rx) = mpsc::channel();
        let run = Box::new(move |sm: &mut SM| {
            let _ = tx.send(f(sm));
        });
        self.requests
            .send(Request::Run(run))
            .map_err(|_| RaftError::Stopped)?;
        rx.recv().map_err(|_| RaftError::Stopped)
    }

    pub fn last_applied(&self) -> u64 {
        self.last_applied.load(Ordering::Acquire)
    }

    /// Stops the thread; pending and later proposals fail with [`RaftError::Stopped`]. Nothing is
    /// flushed: what was acknowledged is in the log already.
    pub fn shutdown(&self) {
        let _ = self.requests.send(Request::Stop);
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl<SM: StateMachine> Drop for RaftNode<SM> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Worker<SM: StateMachine> {
    raw: RawNode<MemStorage>,
    log: DurableLog,
    sm: SM,
    transport: Box<dyn Transport>,
    /// Proposals waiting for their entry to apply: index → (term, reply).
    pending: HashMap<u64, (u64, Reply<SM::Output>)>,
    last_applied: Arc<AtomicU64>,
    leader: Arc<AtomicU64>,
    state: Arc<Mutex<GroupState>>,
    log_bytes: Arc<AtomicU64>,
    tick: Duration,
    /// The membership change in flight: its entry index and who waits for it.
    pending_change: Option<(u64, Reply<()>)>,
    /// Elections this node started since it last saw a leader, and whether it was campaigning
    /// at the last ready (for back-off).
    failed_elections: u32,
    campaigning: bool,
    reads: Reads,
}

/// Reads waiting for their leader to confirm that it leads (see [`RaftNode::read_index`]).
#[derive(Default)]
struct Reads {
    /// Asked since the last ReadIndex request went to raft-rs: they share the next one.
    asked: Vec<Reply<u64>>,
    /// ReadIndex requests sent, by context: when, and who waits for each.
    sent: HashMap<u64, (Instant, Vec<Reply<u64>>)>,
    next_context: u64,
    /// Confirmed, waiting for their read index to be applied.
    confirmed: Vec<(u64, Reply<u64>)>,
}

impl<SM: StateMachine> Worker<SM> {
    fn run(mut self, inbox: mpsc::Receiver<Request<SM>>) {
        // When the Raft clock last ticked; while no tick can act, the time of the last request.
        let mut last_tick = Instant::now();
        loop {
            let mut requests = Vec::new();
            let tick = self.current_tick();
            let next_event = self.ticks_until_event();
            let received = match next_event {
                None => inbox.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(ticks) => {
                    let due = last_tick + tick * ticks;
                    inbox.recv_timeout(due.saturating_duration_since(Instant::now()))
                }
            };
            match received {
                Ok(request) => requests.push(request),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if next_event.is_some() {
                // The ticks that fell due while the thread slept, before what woke it.
                let slept = (last_tick.elapsed().as_nanos() / tick.as_nanos().max(1)) as u32;
                for _ in 0..slept {
                    self.raw.tick();
                }
                last_tick += tick * slept;
            }
            requests.extend(inbox.try_iter());
            for request in requests {
                match request {
                    Request::Propose { command, reply } => self.propose(command, reply),
                    Request::ChangeMembership {
                        change,
                        context,
                        reply,
                    } => self.propose_change(change, context, reply),
                    Request::Checkpoint(f) => {
                        let conf = self.log.conf_state().clone();
                        let raw = &self.raw;
                        let describe = |index: u64| Checkpoint {
                            index,
                            term: raw.raft.raft_log.term(index).unwrap_or(0),
                            voters: conf.voters.clone(),
                            learners: conf.learners.clone(),
                        };
                        f(&mut self.sm, &describe);
                    }
                    Request::Step(message) => {
                        // Messages from unknown or stale peers are errors raft-rs reports and
                        // ignores; nothing to do about them here.
                        if let Err(e) = self.raw.step(message) {
                            tracing::debug!(error = %e, "raft message ignored");
                        }
                    }
                    Request::ReadIndex(reply) => match self.raw.raft.state {
                        StateRole::Leader => self.reads.asked.push(reply),
                        _ => {
                            let _ = reply.send(Err(self.not_leader()));
                        }
                    },
                    Request::TransferLeadership(to) => {
                        if self.raw.raft.state == StateRole::Leader && to != self.raw.raft.id {
                            self.raw.transfer_leader(to);
                        }
                    }
                    Request::Run(f) => f(&mut self.sm),
                    // The log is truncated below, after every request.
                    Request::Flushed => {}
                    Request::Stop => return,
                }
            }
            // A tick that fell due while the requests were handled. (Time spent here beyond one
            // tick is not made up: a thread that was busy for long must not take for silence
            // the messages still queued for it.)
            if last_tick.elapsed() >= self.current_tick() {
                self.raw.tick();
                last_tick = Instant::now();
            }
            self.send_reads();
            if let Err(e) = self.on_ready().and_then(|()| self.truncate_log()) {
                // The log can no longer be trusted to persist: fail everything and stop.
                tracing::error!(error = %e, "raft group stopped after a log failure");
                return;
            }
            if self.ticks_until_event().is_none() {
                last_tick = Instant::now();
            }
        }
    }

    /// Ticks of the Raft clock until one acts (see the module comment): the next heartbeat or
    /// quorum check of a leader, the election timeout of a voter that does not lead. None when
    /// no tick acts: a leader alone in its group, a learner.
    fn ticks_until_event(&self) -> Option<u32> {
        let raft = &self.raw.raft;
        let left = |timeout: usize, elapsed: usize| timeout.saturating_sub(elapsed).max(1) as u32;
        if raft.state == StateRole::Leader {
            let conf = raft.prs().conf();
            if conf.voters().ids().len() == 1 && conf.learners().is_empty() {
                return None;
            }
            let heartbeat = left(raft.heartbeat_timeout(), raft.heartbeat_elapsed());
            let quorum_check = left(raft.election_timeout(), raft.election_elapsed);
            return Some(heartbeat.min(quorum_check));
        }
        if !raft.promotable() {
            return None;
        }
        Some(left(
            raft.randomized_election_timeout(),
            raft.election_elapsed,
        ))
    }

    /// What a request that needs the leader gets from a node that does not lead.
    fn not_leader(&self) -> RaftError {
        let leader = self.raw.raft.leader_id;
        RaftError::NotLeader {
            leader_hint: (leader != 0).then_some(leader),
        }
    }

    /// Sends the reads asked since the last ReadIndex request as one more; reads whose
    /// request got no answer within a tick ask again (raft-rs drops a ReadIndex request
    /// silently while the leader has not yet committed an entry of its term, and a heartbeat
    /// may be lost). An answer to a later request confirms the earlier ones too.
    fn send_reads(&mut self) {
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        let tick = self.tick;
        let reads = &mut self.reads;
        let stale: Vec<u64> = (reads.sent.iter())
            .filter(|(_, (sent, _))| sent.elapsed() >= tick)
            .map(|(&context, _)| context)
            .collect();
        for context in stale {
            if let Some((_, replies)) = reads.sent.remove(&context) {
                reads.asked.extend(replies);
            }
        }
        if reads.asked.is_empty() {
            return;
        }
        let context = reads.next_context;
        reads.next_context += 1;
        self.raw.read_index(context.to_le_bytes().to_vec());
        let asked = std::mem::take(&mut reads.asked);
        reads.sent.insert(context, (Instant::now(), asked));
    }

    /// Takes the read indexes raft-rs confirmed and answers the reads whose index is applied.
    fn confirm_reads(&mut self, confirmed: Vec<raft::ReadState>) {
        let reads = &mut self.reads;
        for state in confirmed {
            let Some(context) = state.request_ctx.first_chunk::<8>() else {
                continue;
            };
            if let Some((_, replies)) = reads.sent.remove(&u64::from_le_bytes(*context)) {
                (reads.confirmed).extend(replies.into_iter().map(|r| (state.index, r)));
            }
        }
        let applied = self.last_applied.load(Ordering::Acquire);
        let (ready, waiting) = (std::mem::take(&mut reads.confirmed).into_iter())
            .partition(|(index, _)| *index <= applied);
        reads.confirmed = waiting;
        for (index, reply) in ready {
            let _ = reply.send(Ok(index));
        }
    }

    fn propose(&mut self, command: Vec<u8>, reply: Reply<SM::Output>) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        match self.raw.propose(vec![], command) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                self.pending.insert(index, (self.raw.raft.term, reply));
            }
            Err(e) => {
                let _ = reply.send(Err(e.into()));
            }
        }
    }

    fn propose_change(&mut self, change: MembershipChange, context: Vec<u8>, reply: Reply<()>) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        if self.pending_change.is_some() {
            let _ = reply.send(Err(RaftError::Busy(
                "another membership change is in progress".into(),
            )));
            return;
        }
        let mut cc = ConfChange::default();
        let (kind, node) = match change {
            MembershipChange::AddLearner(n) => (ConfChangeType::AddLearnerNode, n),
            MembershipChange::AddVoter(n) => (ConfChangeType::AddNode, n),
            MembershipChange::Remove(n) => (ConfChangeType::RemoveNode, n),
        };
        cc.set_change_type(kind);
        cc.node_id = node;
        cc.context = context.into();
        match self.raw.propose_conf_change(vec![], cc) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                self.pending_change = Some((index, reply));
            }
            Err(e) => {
                let _ = reply.send(Err(e.into()));
            }
        }
    }

    /// Applies a committed membership change entry.
    fn apply_change(&mut self, entry: &Entry) -> Result<(), RaftError> {
        // raft-rs wrote it (rust-protobuf encoding, the same wire format).
        let cc = wire::decode::<ConfChange>(entry.get_data())?;
        let conf = match self.raw.apply_conf_change(&cc) {
            Ok(conf) => conf,
            // Replayed after a restart: the membership on disk has it already.
            Err(e) => {
                tracing::debug!(error = %e, "membership change already applied");
                self.log.conf_state().clone()
            }
        };
        self.log.set_conf_state(conf.clone())?;
        self.sm
            .membership_changed(&conf.voters, &conf.learners, &cc.context);
        // Whoever waits for the change sees the new membership.
        self.track_leader();
        if let Some((index, _)) = &self.pending_change {
            if *index == entry.index {
                if let Some((_, reply)) = self.pending_change.take() {
                    let _ = reply.send(Ok(()));
                }
            }
        }
        Ok(())
    }

    /// The ready loop body: persist → send → apply → advance → apply.
    fn on_ready(&mut self) -> Result<(), RaftError> {
        self.track_leader();
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut ready = self.raw.ready();
        if !ready.snapshot().is_empty() {
            return Err(RaftError::Corruption(
                "the leader sent a snapshot: this replica fell behind the leader's log and needs a tablet copy".into(),
            ));
        }
        self.transport.send(ready.take_messages());
        let confirmed = ready.take_read_states();
        self.apply(ready.take_committed_entries())?;
        self.log.append(ready.entries())?;
        self.log_bytes.store(self.log.bytes(), Ordering::Relaxed);
        if let Some(hs) = ready.hs() {
            self.log.set_hard_state(hs.clone())?;
        }
        self.transport.send(ready.take_persisted_messages());
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            self.log.set_commit(commit)?;
        }
        self.transport.send(light.take_messages());
        self.apply(light.take_committed_entries())?;
        self.raw.advance_apply();
        self.confirm_reads(confirmed);
        self.track_leader();
        Ok(())
    }

    /// The Raft clock: while elections keep failing (no leader emerges), this node's ticks slow
    /// down exponentially (up to 8 times), so competing candidates stop colliding.
    fn current_tick(&self) -> Duration {
        if self.raw.raft.leader_id != 0 {
            return self.tick;
        }
        self.tick * (1 << self.failed_elections.min(3))
    }

    /// Publishes who leads; a node that stopped leading fails its waiting proposals (their
    /// entries may still commit under the new leader, or be replaced: the outcome is unknown).
    fn track_leader(&mut self) {
        let leader = self.raw.raft.leader_id;
        self.leader.store(leader, Ordering::Release);
        let campaigning = matches!(
            self.raw.raft.state,
            StateRole::Candidate | StateRole::PreCandidate
        );
        if leader != 0 {
            self.failed_elections = 0;
        } else if campaigning && !self.campaigning {
            self.failed_elections += 1;
        }
        self.campaigning = campaigning;
        {
            let conf = self.log.conf_state();
            let mut state = self.state.lock();
            state.leader = leader;
            state.term = self.raw.raft.term;
            state.commit = self.raw.raft.raft_log.committed;
            state.voters = conf.voters.clone();
            state.learners = conf.learners.clone();
            let leading = self.raw.raft.state == StateRole::Leader;
            let me = self.raw.raft.id;
            let progress: Vec<(u64, u64, bool)> = match leading {
                true => self
                    .raw
                    .raft
                    .prs()
                    .iter()
                    .map(|(id, p)| (*id, p.matched, p.recent_active))
                    .collect(),
                false => Vec::new(),
            };
            state.matched = progress.iter().map(|&(id, m, _)| (id, m)).collect();
            state.inactive = progress
                .iter()
                .filter(|&&(id, _, active)| id != me && !active)
                .map(|&(id, _, _)| id)
                .collect();
        }
        if self.raw.raft.state != StateRole::Leader {
            if let Some((_, reply)) = self.pending_change.take() {
                let _ = reply.send(Err(RaftError::NotLeader {
                    leader_hint: (leader != 0).then_some(leader),
                }));
            }
        }
        if self.raw.raft.state != StateRole::Leader && !self.pending.is_empty() {
            let hint = (leader != 0).then_some(leader);
            for (_, (_, reply)) in self.pending.drain() {
                let _ = reply.send(Err(RaftError::NotLeader { leader_hint: hint }));
            }
        }
        // Reads not yet confirmed cannot be by this node any more (confirmed ones stand: the
        // node led when a majority answered, and they wait only for entries to apply).
        let reads = &mut self.reads;
        if self.raw.raft.state != StateRole::Leader
            && !(reads.asked.is_empty() && reads.sent.is_empty())
        {
            let hint = (leader != 0).then_some(leader);
            let sent = reads.sent.drain().flat_map(|(_, (_, replies))| replies);
            for reply in reads.asked.drain(..).chain(sent) {
                let _ = reply.send(Err(RaftError::NotLeader { leader_hint: hint }));
            }
        }
    }

    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), RaftError> {
        for entry in entries {
            let index = entry.index;
            let mut output = None;
            if entry.get_entry_type() == EntryType::EntryConfChange {
                self.apply_change(&entry)?;
            } else if entry.get_entry_type() == EntryType::EntryNormal
                && !entry.get_data().is_empty()
            {
                output = Some(self.sm.apply(index, &entry.data));
            }
            // Before the proposer hears: whoever it tells finds the entry applied.
            self.last_applied.store(index, Ordering::Release);
            if let Some(output) = output {
                if let Some((term, reply)) = self.pending.remove(&index) {
                    let result = if term == entry.term {
                        Ok(output)
                    } else {
                        Err(RaftError::NotLeader { leader_hint: None })
                    };
                    let _ = reply.send(result);
                }
            }
        }
        Ok(())
    }

    /// Drops the log prefix the state machine has made durable in its own files. A leader
    /// keeps what a follower still needs (copying a tablet to a follower that fell behind the
    /// log comes with the cluster's re-replication).
    fn truncate_log(&mut self) -> Result<(), RaftError> {
        let mut durable = self
            .sm
            .durable_index()
            .min(self.last_applied.load(Ordering::Acquire));
        if self.raw.raft.state == StateRole::Leader {
            for (_, progress) in self.raw.raft.prs().iter() {
                durable = durable.min(progress.matched);
            }
        } else if self.raw.raft.prs().conf().voters().ids().len() > 1 {
            // A follower may lead next, and then a lagging peer needs the entries it kept.
            durable = durable.min(self.log.last_index().saturating_sub(FOLLOWER_LOG_RETENTION));
        }
        self.log.truncate_prefix(durable)?;
        self.log_bytes.store(self.log.bytes(), Ordering::Relaxed);
        Ok(())
    }
}

impl<SM: StateMachine> Drop for Worker<SM> {
    fn drop(&mut self) {
        // A stopped node leads nothing: whoever asks this one goes elsewhere.
        self.leader.store(0, Ordering::Release);
        for (_, (_, reply)) in self.pending.drain() {
            let _ = reply.send(Err(RaftError::Stopped));
        }
    }
}
