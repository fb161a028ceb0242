//! Where a client's tablets live, behind one seam ([`Tablets`]): in this process (the embedded
//! single node, see [`crate::embedded`]) or on a cluster's tablet servers ([`RemoteTablets`]),
//! reached over internal RPC through the [`MetaCache`]. The client does everything with
//! tablets through it, so the embedded node and a cluster share one code path (decision 6).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use nyala_storage::{
    ColumnRange, ScanIterator, ScanSpec, StorageError, Timestamp, WriteBatch, WriteOutcome,
};

use super::meta_cache::{MetaCache, TServerClient};
use crate::rpc::decode_rows;
use crate::rpc::proto::common::TabletRef;
use crate::rpc::proto::tserver::batched_call::Call;
use crate::rpc::proto::tserver::{
    RequestId, ScanNextRequest, ScanOpenRequest, ScanResponse, TxnFinishRequest, TxnRequest,
    TxnWriteRequest, WaitForWriteRequest, WaitForWriteResponse, WriteRequest, WriteResponse,
};
use crate::tserver::replica::TabletReplica;
use crate::tserver::TabletServer;
use crate::Result;

/// What [`crate::Client::tablet_stats`] reports of one tablet.
#[derive(Clone, Debug, Default)]
pub struct TabletStats {
    pub id: String,
    /// Rows in memory and on disk, counting deleted and updated rows too.
    pub estimated_rows: usize,
    pub disk_bytes: u64,
    /// Unflushed data.
    pub memory_bytes: usize,
    /// DiskRowSets.
    pub rowsets: usize,
    /// UNDO and REDO delta files of all rowsets.
    pub delta_files: usize,
    /// Column files of all rowsets (new base data of updated columns).
    pub column_files: usize,
    /// Compactions run since the server started.
    pub compactions: u64,
    /// Where its leader is ("local" in the embedded node).
    pub leader: String,
    pub replicas: usize,
}

/// What a write of a transaction did in a tablet.
pub struct TxnWritten {
    pub outcome: WriteOutcome,
    /// The transaction's prepare timestamp there, if the write prepared it.
    pub prepared: Option<Timestamp>,
}

/// Reads and writes of tablets, wherever they live.
#[async_trait::async_trait]
pub trait Tablets: Send + Sync + 'static {
    /// Applies one write batch to tablet `id` (on its leader): the rows applied, and the rows
    /// refused as conflicts.
    async fn write(&self, id: &str, batch: &WriteBatch) -> Result<WriteOutcome>;
    /// Applies one write batch of transaction `txn` to tablet `id`, kept aside until the
    /// transaction commits; with `prepare`, the transaction's last write there, which also
    /// prepares it (see [`crate::tserver::TabletReplica::txn_write`]).
    async fn txn_write(
        &self,
        id: &str,
        txn: u64,
        batch: &WriteBatch,
        prepare: bool,
    ) -> Result<TxnWritten>;
    /// Tablet `id` prepares transaction `txn` to commit; the prepare timestamp.
    async fn prepare_txn(&self, id: &str, txn: u64) -> Result<Timestamp>;
    /// Transaction `txn` commits at `commit` in tablet `id` (see
    /// [`crate::tserver::TabletReplica::finish_txn`]) or, with None, aborts.
    async fn finish_txn(
        &self,
        id: &str,
        txn: u64,
        commit: Option<Timestamp>,
    ) -> Result<WriteOutcome>;
    /// Scans tablet `id` at `snapshot` (None: its leader's safe snapshot).
    fn scan(&self, id: &str, spec: ScanSpec, snapshot: Option<Timestamp>) -> Result<ScanIterator>;
    /// [`Self::scan`], if it can start without waiting: the tablet is in this process and has
    /// applied every write below `snapshot`. None: call `scan` (on a thread that may block).
    fn scan_if_ready(
        &self,
        _id: &str,
        _spec: ScanSpec,
        _snapshot: Timestamp,
    ) -> Option<Result<ScanIterator>> {
        None
    }
    /// [`Self::scan`], waiting up to `timeout` for rows: a scan that finds none waits for rows
    /// to commit there and scans again (see [`crate::tserver::TabletReplica::scan_waiting`]),
    /// next to the tablet. An empty scan: none came in time.
    async fn scan_waiting(
        &self,
        id: &str,
        spec: ScanSpec,
        snapshot: Option<Timestamp>,
        timeout: Duration,
    ) -> Result<ScanIterator>;
    /// The newest snapshot at which tablet `id` has applied every write it will take below it.
    async fn safe_snapshot(&self, id: &str) -> Result<Timestamp>;
    /// Waits up to `timeout` for rows to become visible in tablet `id` above `after`; returns
    /// the newest timestamp rows became visible at there (see
    /// [`crate::tserver::TabletReplica::wait_for_write`]).
    async fn wait_for_write(
        &self,
        id: &str,
        after: Timestamp,
        timeout: Duration,
    ) -> Result<Timestamp>;
    /// The size and shape of tablet `id` (in a cluster: as its leader last reported).
    fn stats(&self, id: &str) -> Result<TabletStats>;
    /// What tablet `id`'s files say of its columns' values, for planning (empty: unknown; a
    /// remote tablet's are not fetched).
    fn column_ranges(&self, _id: &str) -> Vec<ColumnRange> {
        Vec::new()
    }
    /// The addresses of a cluster's live tablet servers (empty in the embedded node).
    fn servers(&self) -> Vec<String> {
        Vec::new()
    }
    /// Flushes and stops what this process holds of the tablets.
    fn shutdown(&self) -> Result<()> {
        Ok(())
    }
}

/// The longest a waiting call to a tablet server waits: calls on internal connections time out
/// after 30 s, so a longer wait takes several.
const MOST_PER_CALL: Duration = Duration::from_secs(20);

/// The tablets of a cluster, on its tablet servers.
pub struct RemoteTablets {
    meta: Arc<MetaCache>,
    runtime: tokio::runtime::Handle,
    /// The tablet server of this process, if it is one: a tablet it leads is scanned here,
    /// not through the network.
    local: Option<Arc<TabletServer>>,
    /// This client's random id, and the number of its next write: a write sent again to a
    /// tablet (a new leader, a lost answer) carries the same id, so it is applied at most once.
    client_id: u64,
    next_request: std::sync::atomic::AtomicU64,
}

impl RemoteTablets {
    pub fn new(meta: Arc<MetaCache>, runtime: tokio::runtime::Handle) -> Self {
        Self {
            meta,
            runtime,
            local: None,
            // Never 0, which stands for an untracked write.
            client_id: rand::random::<u64>() | 1,
            next_request: Default::default(),
        }
    }

    /// These tablets, scanning those that `local` leads in this process.
    pub fn with_local(self, local: Arc<TabletServer>) -> Self {
        Self {
            local: Some(local),
            ..self
        }
    }

    /// The id of a new write request, to send in every attempt.
    fn new_request(&self) -> RequestId {
        let sent = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        RequestId {
            client: self.client_id,
            seq: (self.next_request).fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            sent_micros: sent.as_micros() as u64,
        }
    }

    /// A wait of up to `timeout` on the leader of tablet `id`, in calls of at most
    /// [`MOST_PER_CALL`]: `call` asks the server to wait for what is left (its second argument),
    /// until an answer is `enough` or the time is up; the server that answered last, and its
    /// answer.
    async fn call_leader_until<T, F, Fut>(
        &self,
        id: &str,
        timeout: Duration,
        call: F,
        enough: impl Fn(&T) -> bool,
    ) -> Result<(u64, T)>
    where
        F: Fn(TServerClient, Duration) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let left = left.min(MOST_PER_CALL);
            let (server, answer) = (self.meta)
                .call_leader(id, |client| call(client, left))
                .await?;
            if enough(&answer) || tokio::time::Instant::now() >= deadline {
                return Ok((server, answer));
            }
        }
    }
}

#[async_trait::async_trait]
impl Tablets for RemoteTablets {
    async fn write(&self, id: &str, batch: &WriteBatch) -> Result<WriteOutcome> {
        let encoded = prost::bytes::Bytes::from(batch.encode());
        let request = self.new_request();
        let (_, answer) = self
            .meta
            .call_leader_batched(id, || {
                Call::Write(WriteRequest {
                    tablet_id: id.into(),
                    batch: encoded.clone(),
                    request: Some(request),
                })
            })
            .await?;
        Ok(outcome(answer))
    }

    fn scan(
        &self,
        id: &str,
        mut spec: ScanSpec,
        snapshot: Option<Timestamp>,
    ) -> Result<ScanIterator> {
        let local = (self.local.as_ref())
            .and_then(|server| server.replica(id).ok())
            .filter(|replica| replica.is_leader());
        spec.snapshot = snapshot.unwrap_or(Timestamp(0));
        let remote = RemoteScan {
            meta: self.meta.clone(),
            runtime: self.runtime.clone(),
            tablet: id.to_string(),
            spec: Some(spec),
            scanner: None,
            batches: VecDeque::new(),
        };
        match local {
            None => Ok(Box::new(remote)),
            Some(replica) => Ok(Box::new(LocalScan::Unopened(replica, remote))),
        }
    }

    async fn scan_waiting(
        &self,
        id: &str,
        mut spec: ScanSpec,
        snapshot: Option<Timestamp>,
        timeout: Duration,
    ) -> Result<ScanIterator> {
        spec.snapshot = snapshot.unwrap_or(Timestamp(0));
        let encoded = prost::bytes::Bytes::from(spec.encode()?);
        let call = |mut server: TServerClient, left: Duration| {
            let request = ScanOpenRequest {
                tablet_id: id.into(),
                spec: encoded.clone(),
                wait_ms: left.as_micros().div_ceil(1000) as u64,
                this_replica: false,
            };
            async move { server.scan_open(request).await }
        };
        let found = |answer: &ScanResponse| !answer.ipc.is_empty() || !answer.done;
        let (server, answer) = self.call_leader_until(id, timeout, call, found).await?;
        Ok(Box::new(RemoteScan {
            meta: self.meta.clone(),
            runtime: self.runtime.clone(),
            tablet: id.to_string(),
            spec: None,
            scanner: (!answer.done).then_some((server, answer.scanner_id)),
            batches: decode_rows(answer.ipc)?.into(),
        }))
    }

    async fn txn_write(
        &self,
        id: &str,
        txn: u64,
        batch: &WriteBatch,
        prepare: bool,
    ) -> Result<TxnWritten> {
        let encoded = prost::bytes::Bytes::from(batch.encode());
        let request = self.new_request();
        let (_, answer) = self
            .meta
            .call_leader_batched(id, || {
                Call::TxnWrite(TxnWriteRequest {
                    tablet_id: id.into(),
                    txn_id: txn,
                    batch: encoded.clone(),
                    prepare,
                    request: Some(request),
                })
            })
            .await?;
        let prepared = (answer.prepare_ts != 0).then_some(Timestamp(answer.prepare_ts));
        Ok(TxnWritten {
            outcome: outcome(answer),
            prepared,
        })
    }

    async fn prepare_txn(&self, id: &str, txn: u64) -> Result<Timestamp> {
        let (_, answer) = self
            .meta
            .call_leader(id, |mut server| {
                let request = TxnRequest {
                    tablet_id: id.into(),
                    txn_id: txn,
                };
                async move { server.txn_prepare(request).await }
            })
            .await?;
        Ok(Timestamp(answer.prepare_ts))
    }

    async fn finish_txn(
        &self,
        id: &str,
        txn: u64,
        commit: Option<Timestamp>,
    ) -> Result<WriteOutcome> {
        let (_, answer) = self
            .meta
            .call_leader_batched(id, || {
                Call::TxnFinish(TxnFinishRequest {
                    tablet_id: id.into(),
                    txn_id: txn,
                    commit: commit.is_some(),
                    commit_ts: commit.map_or(0, |t| t.0),
                })
            })
            .await?;
        Ok(outcome(answer))
    }

    async fn safe_snapshot(&self, id: &str) -> Result<Timestamp> {
        let (_, answer) = self
            .meta
            .call_leader(id, |mut server| {
                let request = TabletRef {
                    tablet_id: id.into(),
                };
                async move { server.safe_snapshot(request).await }
            })
            .await?;
        Ok(Timestamp(answer.snapshot))
    }

    async fn wait_for_write(
        &self,
        id: &str,
        after: Timestamp,
        timeout: Duration,
    ) -> Result<Timestamp> {
        let call = |mut server: TServerClient, left: Duration| {
            let request = WaitForWriteRequest {
                tablet_id: id.into(),
                after: after.0,
                timeout_ms: left.as_millis() as u64,
            };
            async move { server.wait_for_write(request).await }
        };
        let newer = |answer: &WaitForWriteResponse| answer.newest > after.0;
        let (_, answer) = self.call_leader_until(id, timeout, call, newer).await?;
        Ok(Timestamp(answer.newest))
    }

    fn stats(&self, id: &str) -> Result<TabletStats> {
        Ok(self.meta.stats(id))
    }

    fn servers(&self) -> Vec<String> {
        self.meta.live_addresses()
    }
}

/// A scan of a tablet whose leader is in this process: read here once the replica confirms it
/// still leads (as a scan's RPC would have it confirm), else through its leader elsewhere.
enum LocalScan {
    Unopened(Arc<TabletReplica>, RemoteScan),
    Open(ScanIterator),
}

impl Iterator for LocalScan {
    type Item = std::result::Result<RecordBatch, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let LocalScan::Unopened(replica, remote) = self {
            let runtime = remote.runtime.clone();
            let confirm = replica.confirm_leader();
            let confirmed = tokio::task::block_in_place(|| runtime.block_on(confirm));
            let remote = std::mem::replace(remote, RemoteScan::done(&remote.meta, &runtime));
            let opened: ScanIterator = match (confirmed, remote.spec.clone()) {
                (Ok(()), Some(spec)) => {
                    let snapshot = (spec.snapshot.0 != 0).then_some(spec.snapshot);
                    match replica.scan(spec, snapshot) {
                        Ok(scan) => scan,
                        Err(e) => Box::new(std::iter::once(Err(StorageError::Io(
                            std::io::Error::other(e),
                        )))),
                    }
                }
                _ => Box::new(remote),
            };
            *self = LocalScan::Open(opened);
        }
        match self {
            LocalScan::Open(scan) => scan.next(),
            LocalScan::Unopened(..) => None,
        }
    }
}

/// A scan of a tablet on its leader through a scanner; opened at the first batch asked for,
/// then continued chunk by chunk.
struct RemoteScan {
    meta: Arc<MetaCache>,
    runtime: tokio::runtime::Handle,
    tablet: String,
    spec: Option<ScanSpec>,
    /// The server holding the open scanner, and the scanner's id.
    scanner: Option<(u64, u64)>,
    batches: VecDeque<RecordBatch>,
}

impl RemoteScan {
    /// A scan with nothing left to read.
    fn done(meta: &Arc<MetaCache>, runtime: &tokio::runtime::Handle) -> Self {
        RemoteScan {
            meta: meta.clone(),
            runtime: runtime.clone(),
            tablet: String::new(),
            spec: None,
            scanner: None,
            batches: VecDeque::new(),
        }
    }

    fn fetch(&mut self) -> Result<()> {
        let (server, answer): (u64, ScanResponse) = match self.spec.take() {
            Some(spec) => {
                let encoded = prost::bytes::Bytes::from(spec.encode()?);
                let tablet = self.tablet.clone();
                let call = self.meta.call_leader(&self.tablet, |mut server| {
                    let request = ScanOpenRequest {
                        tablet_id: tablet.clone(),
                        spec: encoded.clone(),
                        wait_ms: 0,
                        this_replica: false,
                    };
                    async move { server.scan_open(request).await }
                });
                tokio::task::block_in_place(|| self.runtime.block_on(call))?
            }
            None => {
                let Some((server, scanner_id)) = self.scanner else {
                    return Ok(());
                };
                let call = self.meta.call_server(server, |mut client| async move {
                    client.scan_next(ScanNextRequest { scanner_id }).await
                });
                (
                    server,
                    tokio::task::block_in_place(|| self.runtime.block_on(call))?,
                )
            }
        };
        self.scanner = (!answer.done).then_some((server, answer.scanner_id));
        self.batches.extend(decode_rows(answer.ipc)?);
        Ok(())
    }
}

impl Iterator for RemoteScan {
    type Item = std::result::Result<RecordBatch, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(batch) = self.batches.pop_front() {
                return Some(Ok(batch));
            }
            if self.spec.is_none() && self.scanner.is_none() {
                return None;
            }
            if let Err(e) = self.fetch() {
                self.spec = None;
                self.scanner = None;
                // (The engine's error rides inside, so that a busy or unreachable tablet is
                // reported as such: `nyala_sql`'s errors look for it.)
                return Some(Err(StorageError::Io(std::io::Error::other(e))));
            }
        }
    }
}

/// What a tablet server answered about a write.
fn outcome(answer: WriteResponse) -> WriteOutcome {
    WriteOutcome {
        rows: answer.rows as usize,
        conflicts: answer.conflicts,
        visible_at: (answer.visible_at != 0).then_some(Timestamp(answer.visible_at)),
    }
}
