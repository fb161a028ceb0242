//! A tablet replica: one storage [`Tablet`] behind its Raft log.
//!
//! Every write becomes a log entry `[timestamp][write batch]`: the leader picks the timestamp
//! from the hybrid clock and appends the entry while holding the `inflight` lock, so log order and
//! timestamp order agree. Apply is deterministic (decision 1 in ARCHITECTURE.md): it uses only the
//! entry and the tablet's state, so replaying the log after a crash rebuilds exactly what was
//! acknowledged.
//!
//! Scans read at a *safe* snapshot: just below the oldest write still in flight (proposed but not
//! applied), or "now" if there is none. Every write acknowledged before the scan started is
//! visible, and no write can later appear below the snapshot, so a scan is repeatable.
//!
//! The parts, as Kudu splits `tablet_replica.cc` from the operations it applies:
//! - [`TabletReplica`] (here): proposing writes, transactions and schema changes; scans at a
//!   safe snapshot; leadership, membership, tablet copy, flush and shutdown.
//! - `apply`: [`TabletStateMachine`], what applying a committed entry does on every replica.
//! - `entry`: the log entry's framing (timestamp, request id, operation).
//! - `inflight`: the writes proposed and not yet applied, and the timestamps storage holds.
//! - `peers`: [`Peers`] (`peers.json`) and [`Replication`], how a replica reaches its group.
//! - `staging`: replica directories that appear and go whole ([`discard`], [`remove_staging`]).
//! - `auto_ids`: the auto_incrementing_id a leader gives inserted rows.

mod apply;
mod auto_ids;
mod entry;
mod inflight;
mod peers;
mod staging;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nyala_raft::{RaftConfig, RaftNode};
use nyala_storage::{
    RequestId, ScanIterator, ScanSpec, Schema, Tablet, TabletOp, TabletOptions, Timestamp,
    WriteBatch, WriteKind, WriteOutcome,
};

pub use apply::TabletStateMachine;
use entry::LoggedOp;
use inflight::{Inflight, Pending};
pub use peers::{Peers, Replication};
pub use staging::{beside, clone_staging_dir, discard, remove_staging};
use staging::{build_in_place, place};

use crate::clock::HybridClock;
use crate::tserver::maintenance::signal::MaintenanceSignal;
use crate::{EngineError, Result};

/// Raft node id of the only voter of a single-replica tablet.
const LOCAL_NODE_ID: u64 = 1;

/// Longest a read waits for its replica to confirm that it leads (see
/// [`TabletReplica::confirm_leader`]): past the election timeout, after which a leader that
/// cannot reach a majority has stepped down.
const READ_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// What the Raft node answers once a proposed entry is applied.
type AppliedAnswer = std::result::Result<
    std::result::Result<WriteOutcome, nyala_storage::StorageError>,
    nyala_raft::RaftError,
>;

/// A client's request as its tablet's leader gets it: its id, the same in every attempt to
/// send it, and when the client first sent it.
#[derive(Clone, Copy, Debug)]
pub struct ClientRequest {
    pub id: RequestId,
    pub sent: Timestamp,
}

/// Where a copied tablet's files stand in its group's log: the entry they are durable up to,
/// its term, and the membership then.
#[derive(Debug, Clone)]
pub struct CopyPosition {
    pub index: u64,
    pub term: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

/// A replica's files as of one log entry, opened, to create a new replica from (tablet copy).
/// The open handles keep the files readable even if a compaction removes them meanwhile.
#[derive(Debug)]
pub struct TabletCopy {
    pub position: CopyPosition,
    /// The tablet's data files: (name, file, length).
    pub files: Vec<(String, std::fs::File, u64)>,
}

pub struct TabletReplica {
    /// The next auto_incrementing_id this leader hands out.
    next_auto_id: Mutex<i64>,
    id: String,
    dir: PathBuf,
    tablet: Arc<Tablet>,
    raft: RaftNode<TabletStateMachine>,
    clock: Arc<HybridClock>,
    inflight: Inflight,
    /// Set when the replica is stopped for its data to be deleted.
    deleted: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for TabletReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TabletReplica")
            .field("id", &self.id)
            .finish()
    }
}

impl TabletReplica {
    /// Creates a new, empty tablet replica in `dir`: a single-voter tablet, or with
    /// `replication` one replica of a tablet replicated among its peers. `maintenance` (the
    /// hosting server's) hears of every write the replica applies.
    pub fn create(
        dir: &Path,
        id: &str,
        schema: Schema,
        options: TabletOptions,
        clock: Arc<HybridClock>,
        replication: Option<Replication>,
        maintenance: Option<Arc<MaintenanceSignal>>,
    ) -> Result<Self> {
        build_in_place(dir, |staging| {
            if let Some(r) = &replication {
                r.peers.write(staging)?;
            }
            Tablet::create(&staging.join("data"), schema, options.clone())?;
            Ok(())
        })?;
        Self::open(dir, id, options, clock, replication, maintenance)
    }

    /// The peers of the replica in `dir`, if it is replicated.
    pub fn peers(dir: &Path) -> Result<Option<Peers>> {
        Peers::read(dir)
    }

    /// Opens an existing replica, replaying its log past what the tablet has on disk.
    /// `replication` must be given for a replicated tablet (see [`Self::peers`]).
    pub fn open(
        dir: &Path,
        id: &str,
        options: TabletOptions,
        clock: Arc<HybridClock>,
        replication: Option<Replication>,
        maintenance: Option<Arc<MaintenanceSignal>>,
    ) -> Result<Self> {
        let tablet = Tablet::open(&dir.join("data"), options)?;
        Self::start(dir, id, tablet, clock, replication, maintenance)
    }

    fn start(
        dir: &Path,
        id: &str,
        tablet: Tablet,
        clock: Arc<HybridClock>,
        replication: Option<Replication>,
        maintenance: Option<Arc<MaintenanceSignal>>,
    ) -> Result<Self> {
        let tablet = Arc::new(tablet);
        let inflight = Inflight::default();
        // Transactions prepared and turns waiting before the last flush (their entries are
        // not replayed).
        inflight.change_holds(&tablet.take_holds());
        let sm = TabletStateMachine {
            tablet: tablet.clone(),
            inflight: inflight.clone(),
            clock: clock.clone(),
            dir: dir.to_path_buf(),
            learn: replication.as_ref().and_then(|r| r.learn.clone()),
            maintenance,
        };
        let raft = match replication {
            None => RaftNode::open(RaftConfig::new(LOCAL_NODE_ID, dir.join("wal")), sm)?,
            Some(r) => RaftNode::open_with_transport(
                RaftConfig {
                    lazy_commit_broadcast: !r.followers_serve_reads,
                    ..RaftConfig::new(r.server_id, dir.join("wal")).with_voters(r.peers.voters)
                },
                sm,
                r.transport,
            )?,
        };
        Ok(Self {
            next_auto_id: Mutex::new(0),
            id: id.to_string(),
            dir: dir.to_path_buf(),
            tablet,
            raft,
            clock,
            inflight,
            deleted: Default::default(),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn schema(&self) -> Arc<Schema> {
        self.tablet.schema()
    }

    pub fn tablet(&self) -> &Arc<Tablet> {
        &self.tablet
    }

    /// Replicates and applies one write batch; returns the rows applied and those refused as
    /// conflicts (see [`WriteBatch::unchanged_since`]). The batch is applied entirely or not at
    /// all.
    /// In a table with a NON UNIQUE PRIMARY KEY, inserted rows get their auto_incrementing_id
    /// here, on the leader, in log order.
    pub async fn write(&self, batch: &WriteBatch) -> Result<WriteOutcome> {
        self.write_request(batch, None).await
    }

    /// [`Self::write`] for a client's `request`: applied at most once however often it is
    /// sent (see [`nyala_storage::RequestId`]).
    pub async fn write_request(
        &self,
        batch: &WriteBatch,
        request: Option<ClientRequest>,
    ) -> Result<WriteOutcome> {
        self.check_auto_ids(batch)?;
        if let Some(done) = self.applied_request(request)? {
            return Ok(done);
        }
        let write = || Ok(TabletOp::Write(self.with_auto_ids(batch)?));
        (self.propose_with(request.map(|r| r.id), write).await).map(|(_, outcome)| outcome)
    }

    /// What `request` did, if this replica applied it already (a request sent again: its
    /// answer was lost); an error for a request sent too long ago to be taken (see
    /// [`Tablet::request_expired`]).
    fn applied_request(&self, request: Option<ClientRequest>) -> Result<Option<WriteOutcome>> {
        let Some(request) = request else {
            return Ok(None);
        };
        if let Some(Ok(outcome)) = self.tablet.applied_request(request.id) {
            return Ok(Some(outcome));
        }
        if Tablet::request_expired(request.sent, self.clock.now()) {
            return Err(EngineError::Unavailable(format!(
                "request {} of client {:x} was first sent at {}, too long ago to be applied \
                 now; it was not applied here",
                request.id.seq,
                request.id.client,
                request.sent.display()
            )));
        }
        Ok(None)
    }

    /// Refuses an UPSERT into a table with a NON UNIQUE PRIMARY KEY.
    fn check_auto_ids(&self, batch: &WriteBatch) -> Result<()> {
        match (self.tablet.schema().auto_increment_column(), batch.kind) {
            (Some(_), WriteKind::Upsert) => Err(EngineError::Unsupported(
                "UPSERT needs a unique primary key; this table has a NON UNIQUE PRIMARY KEY \
                 (INSERT adds rows, UPDATE changes them)"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// `batch`, its inserted rows with their auto_incrementing_ids in a table with a NON
    /// UNIQUE PRIMARY KEY. Runs under the lock that orders proposals.
    fn with_auto_ids(&self, batch: &WriteBatch) -> Result<WriteBatch> {
        match (self.tablet.schema().auto_increment_column(), batch.kind) {
            (Some(_), WriteKind::Insert | WriteKind::InsertIgnore) => {
                let n = batch.rows.num_rows() as i64;
                let mut next = self
                    .next_auto_id
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let next_free = (*next).max(self.tablet.next_auto_id());
                // A table keyed by the id alone: the ids of this tablet's bucket.
                let (first, step) = match batch.auto_ids {
                    Some(ids) => (
                        ids.first_at_or_after(next_free),
                        i64::from(ids.modulus.max(1)),
                    ),
                    None => (next_free, 1),
                };
                let rows = auto_ids::with_auto_ids(&batch.rows, first, n, step)?;
                *next = match n {
                    0 => next_free,
                    n => first + (n - 1) * step + 1,
                };
                Ok(WriteBatch::new(batch.kind, rows))
            }
            _ => Ok(batch.clone()),
        }
    }

    /// Replicates and applies a write of transaction `txn`, kept aside until it commits (see
    /// [`Tablet::apply_txn_write`]); with `prepare`, the transaction's last write here, which
    /// prepares it in the same entry (as [`Self::prepare_txn`] after it would). Returns what
    /// the write did and, if the transaction is prepared here, its prepare timestamp.
    pub async fn txn_write(
        &self,
        txn: u64,
        batch: &WriteBatch,
        prepare: bool,
        request: Option<ClientRequest>,
    ) -> Result<(WriteOutcome, Option<Timestamp>)> {
        self.check_auto_ids(batch)?;
        let outcome = match self.applied_request(request)? {
            Some(done) => done,
            None => {
                let write = || {
                    let batch = self.with_auto_ids(batch)?;
                    Ok(TabletOp::TxnWrite {
                        txn,
                        batch,
                        prepare,
                    })
                };
                self.propose_with(request.map(|r| r.id), write).await?.1
            }
        };
        let prepared = match prepare {
            true => self.tablet.txn_state(txn).and_then(|t| t.prepared),
            false => None,
        };
        Ok((outcome, prepared))
    }

    /// Replicates that transaction `txn` is committing; returns the prepare timestamp, a lower
    /// bound of the commit timestamp.
    pub async fn prepare_txn(&self, txn: u64) -> Result<Timestamp> {
        let op = TabletOp::TxnPrepare { txn };
        let (ts, _) = self.propose_with(None, || Ok(op)).await?;
        // Prepared before (a retried call): that prepare holds, at its timestamp.
        let prepared = self.tablet.txn_state(txn).and_then(|t| t.prepared);
        Ok(prepared.unwrap_or(ts))
    }

    /// Replicates the end of transaction `txn`: its commit at `commit` (None: an abort; a
    /// timestamp of 0: at the commit entry's own, for a transaction with one participant that
    /// was not prepared). Returns the rows it commits and when they become visible (in a queue
    /// table maybe after this returns: snapshots at or above it wait for them).
    pub async fn finish_txn(&self, txn: u64, commit: Option<Timestamp>) -> Result<WriteOutcome> {
        let op = match commit {
            Some(commit_ts) => {
                // A prepare proposed after this commit takes a later timestamp, so the next
                // transaction commits above this one.
                if commit_ts.0 != 0 {
                    self.clock.observe(commit_ts);
                }
                TabletOp::TxnCommit { txn, commit_ts }
            }
            None => TabletOp::TxnAbort { txn },
        };
        let finished = self.propose_with(None, || Ok(op)).await;
        finished.map(|(_, outcome)| outcome)
    }

    /// The transactions with writes here that have not ended.
    pub fn pending_txns(&self) -> Vec<nyala_storage::TxnState> {
        self.tablet.pending_txns()
    }

    /// Replicates and applies a schema change (see [`Tablet::alter_schema`]).
    pub async fn alter_schema(&self, schema: &Schema) -> Result<()> {
        self.propose_with(None, || Ok(TabletOp::AlterSchema(schema.clone())))
            .await
            .map(drop)
    }

    /// Replicates a clone of the tablet into new tablet `target`: each replica that applies
    /// the entry stages the clone's files (see [`Tablet::make_clone`]). Returns an index at or
    /// after the entry's: a replica that has applied it has staged the clone.
    pub async fn clone_to(&self, target: &str, as_of: Option<Timestamp>) -> Result<u64> {
        let op = TabletOp::Clone {
            target: target.to_string(),
            as_of,
        };
        self.propose_with(None, || Ok(op)).await?;
        Ok(self.raft.last_applied())
    }

    /// Makes the clone staged in `staged` (see [`clone_staging_dir`]) the replica `id` in
    /// `dir` and opens it (one of a group among `replication`'s peers, or a single voter).
    pub fn open_clone(
        staged: &Path,
        dir: &Path,
        id: &str,
        options: TabletOptions,
        clock: Arc<HybridClock>,
        replication: Option<Replication>,
        maintenance: Option<Arc<MaintenanceSignal>>,
    ) -> Result<Self> {
        if let Some(r) = &replication {
            r.peers.write(staged)?;
        }
        place(staged, dir)?;
        Self::open(dir, id, options, clock, replication, maintenance)
    }

    /// Proposes the operation `op` makes (for a client's `request`, if it is one); it runs,
    /// and the entry is encoded, under the lock that orders proposals. Returns the entry's
    /// timestamp and what applying it did.
    async fn propose_with(
        &self,
        request: Option<RequestId>,
        op: impl FnOnce() -> Result<TabletOp>,
    ) -> Result<(Timestamp, WriteOutcome)> {
        let (ts, applied) = {
            let mut pending = self.inflight.lock();
            let entry = LoggedOp::frame(&op()?, request);
            self.enqueue(&mut pending, entry)
        };
        self.applied(ts, applied).await
    }

    /// Proposes `entry` (see [`LoggedOp::frame`]) at a new timestamp, with `pending` (the
    /// in-flight lock) held: the Raft node enqueues before this returns, so entries reach the
    /// log in timestamp order.
    fn enqueue(
        &self,
        pending: &mut Pending,
        mut entry: Vec<u8>,
    ) -> (Timestamp, impl std::future::Future<Output = AppliedAnswer>) {
        let ts = self.clock.now();
        pending.writes.insert(ts.0);
        LoggedOp::stamp(&mut entry, ts);
        (ts, self.raft.propose(entry))
    }

    /// The answer of the entry proposed at `ts` once `applied`.
    async fn applied(
        &self,
        ts: Timestamp,
        applied: impl std::future::Future<Output = AppliedAnswer>,
    ) -> Result<(Timestamp, WriteOutcome)> {
        match applied.await {
            Ok(result) => Ok((ts, result?)),
            Err(e) => {
                self.inflight.remove(ts.0);
                Err(e.into())
            }
        }
    }

    /// Hands the replica a Raft message from a peer.
    pub fn step(&self, message: nyala_raft::Message) {
        self.raft.step(message);
    }

    /// Waits until this replica may serve a read as its tablet's leader: a majority of its
    /// group confirmed after the call that it still leads, and it has applied every entry
    /// committed before (see [`RaftNode::read_index`]). So a read that follows sees every
    /// write acknowledged before it began, whichever leader took it: a replica that was
    /// paused, cut off or restarted and still takes itself for the leader never answers from
    /// what it has not caught up on. NotLeader where it does not lead or cannot tell within
    /// [`READ_CONFIRM_TIMEOUT`] (a leader cut off steps down within an election timeout).
    pub async fn confirm_leader(&self) -> Result<()> {
        match tokio::time::timeout(READ_CONFIRM_TIMEOUT, self.raft.read_index()).await {
            Ok(confirmed) => confirmed.map(drop).map_err(EngineError::from),
            Err(_) => Err(EngineError::Raft(nyala_raft::RaftError::NotLeader {
                leader_hint: None,
            })),
        }
    }

    /// Whether this replica leads its tablet.
    pub fn is_leader(&self) -> bool {
        self.raft.is_leader()
    }

    /// The server id of the replica's leader, if known.
    pub fn leader(&self) -> Option<u64> {
        self.raft.leader()
    }

    /// The index of the last log entry applied here.
    pub fn last_applied(&self) -> u64 {
        self.raft.last_applied()
    }

    /// The newest timestamp at which a read sees every applied write and nothing can change.
    /// Transactions being committed do not hold it back: a scan at it waits for them (see
    /// [`Self::scan`]), so that a transaction's commit is seen as soon as it is acknowledged.
    pub fn safe_snapshot(&self) -> Timestamp {
        let inflight = self.inflight.lock();
        let now = self.clock.now();
        match inflight.writes.first() {
            Some(&oldest) => Timestamp(oldest - 1),
            None => now,
        }
    }

    /// Waits up to `timeout` for rows to become visible here above `after`; returns the newest
    /// timestamp rows became visible at (not above `after` if none did in time). A commit wakes
    /// the waiters at once.
    pub async fn wait_for_write(&self, after: Timestamp, timeout: Duration) -> Timestamp {
        let mut written = self.inflight.written.subscribe();
        let newer = async {
            let newest = written.wait_for(|&newest| newest > after.0).await;
            newest.map(|newest| *newest)
        };
        match tokio::time::timeout(timeout, newer).await {
            Ok(Ok(newest)) => Timestamp(newest),
            _ => Timestamp(*self.inflight.written.borrow()),
        }
    }

    /// Scans the tablet; a `spec.snapshot` of `None` means the current safe snapshot.
    ///
    /// A snapshot chosen elsewhere (another server's clock, in a cluster) may be ahead of this
    /// replica: the clock first moves past it, so no later write lands below it, and the scan
    /// waits for writes still in flight below it. Every scan waits for the transactions
    /// prepared at or below its snapshot to commit or abort.
    pub fn scan(&self, spec: ScanSpec, snapshot: Option<Timestamp>) -> Result<ScanIterator> {
        let s = match snapshot {
            None => self.safe_snapshot(),
            Some(s) => s,
        };
        let s = read_snapshot(&spec, s);
        // Writes proposed from now on get timestamps above `s`.
        self.clock.observe(s);
        if !self.inflight.wait_until_applied(s, Duration::from_secs(10)) {
            return Err(EngineError::Busy(format!(
                "tablet {}: writes or transactions below snapshot {} are still being applied",
                self.id, s.0
            )));
        }
        self.scan_at(spec, s)
    }

    /// [`Self::scan`] at `snapshot`, if every write below it is applied already (None: the
    /// scan would have to wait for them, which `scan` does).
    pub fn scan_if_ready(
        &self,
        spec: ScanSpec,
        snapshot: Timestamp,
    ) -> Option<Result<ScanIterator>> {
        let snapshot = read_snapshot(&spec, snapshot);
        self.clock.observe(snapshot);
        self.inflight
            .applied(snapshot)
            .then(|| self.scan_at(spec, snapshot))
    }

    /// [`Self::scan`], waiting up to `timeout` for rows to read: while a scan finds none, it
    /// waits for rows to become visible above its snapshot (see [`Self::wait_for_write`]) and
    /// scans again at the newest, until a scan finds rows or the time is up (then the last,
    /// empty, scan answers). A queue's long poll, where the tablet is: a commit that wakes it
    /// is read without a round trip, and one that brings only rows the scan's predicates
    /// leave out (another queue's) puts it back to waiting.
    pub async fn scan_waiting(
        self: &Arc<Self>,
        spec: ScanSpec,
        snapshot: Option<Timestamp>,
        timeout: Duration,
    ) -> Result<ScanIterator> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut snapshot = snapshot.unwrap_or_else(|| self.safe_snapshot());
        loop {
            let (replica, spec) = (self.clone(), spec.clone());
            let scan = crate::rpc::blocking(move || {
                let mut scan = replica.scan(spec, Some(snapshot))?;
                for batch in scan.by_ref() {
                    let batch = batch?;
                    if batch.num_rows() > 0 {
                        let rows: ScanIterator = Box::new(std::iter::once(Ok(batch)).chain(scan));
                        return Ok(Some(rows));
                    }
                }
                Ok(None)
            })
            .await?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match scan {
                Some(scan) => return Ok(scan),
                None if left.is_zero() => return Ok(Box::new(std::iter::empty())),
                None => snapshot = snapshot.max(self.wait_for_write(snapshot, left).await),
            }
        }
    }

    /// Scans at `snapshot`, every write below which is applied.
    fn scan_at(&self, mut spec: ScanSpec, snapshot: Timestamp) -> Result<ScanIterator> {
        spec.snapshot = snapshot;
        Ok(Box::new(crate::metrics::CountedScan(
            self.tablet.scan(&spec)?,
        )))
    }

    /// The replica's files after a flush, and the log entry they are durable up to: what a new
    /// replica starts from.
    pub fn copy(&self) -> Result<TabletCopy> {
        let data = self.dir.join("data");
        self.raft
            .checkpoint(move |sm, describe| -> Result<TabletCopy> {
                sm.tablet.flush()?;
                let at = describe(sm.tablet.durable_index());
                let mut files = Vec::new();
                for entry in std::fs::read_dir(&data)? {
                    let entry = entry?;
                    let name = entry.file_name().to_string_lossy().to_string();
                    let file = std::fs::File::open(entry.path())?;
                    let len = file.metadata()?.len();
                    files.push((name, file, len));
                }
                Ok(TabletCopy {
                    position: CopyPosition {
                        index: at.index,
                        term: at.term,
                        voters: at.voters,
                        learners: at.learners,
                    },
                    files,
                })
            })?
    }

    /// Creates replica `id` in `dir` from the tablet files in `copied` (taken from another
    /// replica at `copy`) and opens it as a learner of its group.
    #[allow(clippy::too_many_arguments)]
    pub fn install(
        dir: &Path,
        id: &str,
        copied: &Path,
        copy: CopyPosition,
        options: TabletOptions,
        clock: Arc<HybridClock>,
        replication: Replication,
        maintenance: Option<Arc<MaintenanceSignal>>,
    ) -> Result<Self> {
        let mut learners = copy.learners.clone();
        if !learners.contains(&replication.server_id) {
            learners.push(replication.server_id);
        }
        build_in_place(dir, |staging| {
            std::fs::rename(copied, staging.join("data"))?;
            nyala_raft::create_log_at(
                &staging.join("wal"),
                copy.index,
                copy.term,
                copy.voters,
                learners,
            )?;
            replication.peers.write(staging)
        })?;
        Self::open(dir, id, options, clock, Some(replication), maintenance)
    }

    /// Proposes one membership change of the tablet's group (on its leader); `member_address`
    /// tells every member where an added server listens.
    pub async fn change_membership(
        &self,
        change: nyala_raft::MembershipChange,
        member_address: Option<(u64, String)>,
    ) -> Result<()> {
        let context = member_address
            .map(|(id, a)| format!("{id}={a}").into_bytes())
            .unwrap_or_default();
        Ok(self.raft.change_membership(change, context).await?)
    }

    /// Asks this replica, if it leads, to hand leadership to voter `to` (see
    /// [`nyala_raft::RaftNode::transfer_leadership`]).
    pub fn transfer_leadership(&self, to: u64) -> Result<()> {
        if !self.raft.is_leader() {
            return Err(EngineError::Raft(nyala_raft::RaftError::NotLeader {
                leader_hint: self.raft.leader(),
            }));
        }
        crate::metrics::engine().leader_transfers.inc();
        Ok(self.raft.transfer_leadership(to)?)
    }

    /// The tablet's group as this replica sees it.
    pub fn group_state(&self) -> nyala_raft::GroupState {
        self.raft.group_state()
    }

    /// Bytes of the replica's log on disk.
    pub fn log_bytes(&self) -> u64 {
        self.raft.log_bytes()
    }

    /// This replica's Raft node id.
    pub fn node_id(&self) -> u64 {
        self.raft.id()
    }

    /// Flushes in-memory data to disk while the Raft thread goes on applying: the tablet
    /// records the last log entry its files hold, and the log behind it can be dropped.
    pub fn flush(&self) -> Result<()> {
        self.tablet.flush()?;
        self.raft.state_machine_flushed();
        Ok(())
    }

    /// Runs one compaction of the tablet's files while the Raft thread goes on applying (it
    /// flushes first what the rewritten rowsets have in memory).
    pub fn compact(&self, kind: &nyala_storage::MaintenanceKind) -> Result<()> {
        self.tablet.compact(kind)?;
        self.raft.state_machine_flushed();
        Ok(())
    }

    /// Flushes and stops the replica.
    pub fn shutdown(&self) -> Result<()> {
        let flushed = self.flush();
        self.raft.shutdown();
        flushed
    }

    /// Stops the replica without flushing (its data is about to be deleted).
    pub fn stop(&self) {
        self.deleted
            .store(true, std::sync::atomic::Ordering::Release);
        self.raft.shutdown();
    }

    /// Whether the replica was stopped for its data to be deleted (maintenance running on it
    /// meanwhile fails, and that is no error).
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The snapshot a scan by `spec` reads at when asked for `snapshot`: a diff scan reads to the
/// end of the microsecond (its commit times are microseconds: a consumer that goes on from the
/// last one it received must have had every change of that microsecond).
fn read_snapshot(spec: &ScanSpec, snapshot: Timestamp) -> Timestamp {
    match spec.changes_since {
        Some(_) => snapshot.end_of_microsecond(),
        None => snapshot,
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
    use arrow::datatypes::Int64Type;
    use nyala_storage::{ColumnSchema, ColumnType, StorageError};

    use super::*;

    fn schema() -> Schema {
        Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("v", ColumnType::Int64, false),
            ],
            vec![0],
        )
        .unwrap()
    }

    /// A new single-voter replica of tablet "t" of `schema()` in `path`.
    fn new_replica(path: &std::path::Path, clock: &Arc<HybridClock>) -> TabletReplica {
        TabletReplica::create(
            path,
            "t",
            schema(),
            TabletOptions::default(),
            clock.clone(),
            None,
            None,
        )
        .unwrap()
    }

    fn batch(kind: WriteKind, k: i64, v: i64) -> WriteBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![k])),
            Arc::new(Int64Array::from(vec![v])),
        ];
        let rows = RecordBatch::try_new(schema().arrow_schema(), columns).unwrap();
        WriteBatch::new(kind, rows)
    }

    fn rows(replica: &TabletReplica) -> Vec<(i64, i64)> {
        let mut rows = Vec::new();
        let spec = ScanSpec {
            projection: None,
            predicates: Vec::new(),
            snapshot: Timestamp(0),
            limit: None,
            batch_size: 1024,
            string_views: false,
            changes_since: None,
        };
        for batch in replica.scan(spec, None).unwrap() {
            let batch = batch.unwrap();
            let (k, v) = (batch.column(0), batch.column(1));
            let (k, v) = (k.as_primitive::<Int64Type>(), v.as_primitive::<Int64Type>());
            rows.extend(k.values().iter().copied().zip(v.values().iter().copied()));
        }
        rows
    }

    fn request(clock: &HybridClock, seq: u64) -> ClientRequest {
        ClientRequest {
            id: RequestId { client: 7, seq },
            sent: clock.now(),
        }
    }

    /// The log entry of `write` for `request` proposed again, as a new leader gets it when
    /// the client sends the request again (the leader that answered it is gone).
    async fn resend(
        replica: &TabletReplica,
        request: ClientRequest,
        write: &WriteBatch,
    ) -> Result<WriteOutcome> {
        let op = || Ok(TabletOp::Write(write.clone()));
        Ok(replica.propose_with(Some(request.id), op).await?.1)
    }

    /// A write sent again is answered with what its first application did and changes
    /// nothing, also once its entry was flushed (the record is in the tablet's metadata) or
    /// replayed after a crash; a write that failed is applied when sent again; a write first
    /// sent too long ago is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_sent_again_is_applied_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let clock = Arc::new(HybridClock::new());
        let open = || {
            TabletReplica::open(
                &path,
                "t",
                TabletOptions::default(),
                clock.clone(),
                None,
                None,
            )
            .unwrap()
        };
        let replica = new_replica(&path, &clock);
        let insert = batch(WriteKind::Insert, 1, 10);
        let first = request(&clock, 1);
        let done = replica.write_request(&insert, Some(first)).await.unwrap();
        assert_eq!(done.rows, 1);
        replica
            .write(&batch(WriteKind::Upsert, 1, 20))
            .await
            .unwrap();
        // Sent again: no duplicate key, and the later write stands.
        assert_eq!(resend(&replica, first, &insert).await.unwrap(), done);
        assert_eq!(
            replica.write_request(&insert, Some(first)).await.unwrap(),
            done
        );
        assert_eq!(rows(&replica), [(1, 20)]);

        // Flushed and opened again.
        replica.shutdown().unwrap();
        drop(replica);
        let replica = open();
        assert_eq!(resend(&replica, first, &insert).await.unwrap(), done);
        assert_eq!(rows(&replica), [(1, 20)]);

        // Replayed from the log after a crash (dropped without a flush).
        let second = request(&clock, 2);
        let upsert = batch(WriteKind::Upsert, 2, 30);
        let done = replica.write_request(&upsert, Some(second)).await.unwrap();
        replica
            .write(&batch(WriteKind::Upsert, 2, 40))
            .await
            .unwrap();
        drop(replica);
        let replica = open();
        assert_eq!(resend(&replica, second, &upsert).await.unwrap(), done);
        assert_eq!(rows(&replica), [(1, 20), (2, 40)]);

        // A write that failed changed nothing: sent again, it is applied.
        let third = request(&clock, 3);
        let again = batch(WriteKind::Insert, 1, 50);
        let failed = replica.write_request(&again, Some(third)).await;
        assert!(matches!(
            failed,
            Err(EngineError::Storage(StorageError::DuplicateKey { .. }))
        ));
        replica
            .write(&batch(WriteKind::Delete, 1, 0))
            .await
            .unwrap();
        assert_eq!(resend(&replica, third, &again).await.unwrap().rows, 1);
        assert_eq!(rows(&replica), [(1, 50), (2, 40)]);

        // First sent longer ago than a retry may be.
        let old = ClientRequest {
            id: RequestId { client: 7, seq: 4 },
            sent: Timestamp::from_micros(clock.now().micros() - 61_000_000),
        };
        let refused = replica
            .write_request(&batch(WriteKind::Upsert, 3, 0), Some(old))
            .await;
        assert!(refused.is_err());
        assert_eq!(rows(&replica), [(1, 50), (2, 40)]);
    }

    /// A write in flight holds the safe snapshot just below it: a scan at or above it waits
    /// (or, asked not to wait, does not start) until the write is applied, then sees it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_safe_snapshot_stays_below_a_write_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(HybridClock::new());
        let replica = new_replica(&dir.path().join("t"), &clock);
        replica
            .write(&batch(WriteKind::Insert, 1, 10))
            .await
            .unwrap();
        // No write in flight: the snapshot is now, and sees what was written.
        let before = replica.safe_snapshot();
        assert!(before < clock.now());
        assert_eq!(rows(&replica), [(1, 10)]);

        // A proposal's timestamp taken, its entry not applied yet.
        let in_flight = clock.now();
        replica.inflight.lock().writes.insert(in_flight.0);
        assert_eq!(replica.safe_snapshot(), Timestamp(in_flight.0 - 1));
        let spec = || ScanSpec {
            projection: None,
            predicates: Vec::new(),
            snapshot: Timestamp(0),
            limit: None,
            batch_size: 1024,
            string_views: false,
            changes_since: None,
        };
        assert!(replica.scan_if_ready(spec(), in_flight).is_none());
        assert!(replica
            .scan_if_ready(spec(), Timestamp(in_flight.0 - 1))
            .is_some());
        replica.inflight.remove(in_flight.0);
        assert!(replica.scan_if_ready(spec(), in_flight).is_some());
        assert!(replica.safe_snapshot() > in_flight);
        replica.shutdown().unwrap();
    }
}
