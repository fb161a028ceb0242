//! Where a database's tablets live: in this process ([`TabletHost::Local`], the embedded single
//! node), or on tablet servers of a cluster ([`TabletHost::Cluster`]), reached over internal
//! RPC. The master and the client do everything with tablets through a host, so the embedded
//! node and a cluster share one code path (decision 6).
//!
//! A cluster knows its tablet servers from their heartbeats (address and the status of every
//! replica, including who leads it). It places a new tablet's replicas on the live servers that
//! hold the fewest, sends writes to the leader (learnt from heartbeats and NotLeader answers,
//! retried until a deadline), and scans through scanners on the leader.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use nyala_storage::{ScanIterator, ScanSpec, Schema, Timestamp, WriteBatch};
use parking_lot::{Mutex, RwLock};

use crate::client::TabletStats;
use crate::rpc::{
    request, AlterSchema, CreateReplica, Peer, RpcClient, RpcResponse, ScanNext, ScanOpen,
    ServerStatus, TabletRef, Write,
};
use crate::tserver::TabletServer;
use crate::{EngineError, Result};

/// A server that has not sent a heartbeat for this long is taken for dead.
const SERVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write or schema change keeps looking for a tablet's leader.
const LEADER_DEADLINE: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub enum TabletHost {
    Local(Arc<TabletServer>),
    Cluster(Arc<Cluster>),
}

impl TabletHost {
    /// Creates tablet `id` with `replicas` replicas (0: the host's default); returns the servers
    /// that hold them (empty for a local tablet).
    pub async fn create_tablet(
        &self,
        id: &str,
        schema: &Schema,
        replicas: usize,
    ) -> Result<Vec<u64>> {
        match self {
            TabletHost::Local(tserver) => {
                if replicas > 1 {
                    return Err(EngineError::InvalidTable(format!(
                        "replicas = {replicas}: this single node has one tablet server; run a \
                         cluster (nyala master + nyala tserver) for more replicas"
                    )));
                }
                tserver.create_tablet(id, schema)?;
                Ok(vec![])
            }
            TabletHost::Cluster(cluster) => cluster.create_tablet(id, schema, replicas).await,
        }
    }

    /// Deletes tablet `id`, whose replicas are on `servers`.
    pub async fn delete_tablet(&self, id: &str, servers: &[u64]) -> Result<()> {
        match self {
            TabletHost::Local(tserver) => tserver.delete_tablet(id),
            TabletHost::Cluster(cluster) => {
                for server in servers {
                    let response = cluster
                        .call_server(
                            *server,
                            request::Kind::DeleteReplica(TabletRef {
                                tablet_id: id.into(),
                            }),
                        )
                        .await?;
                    if !response.error.is_empty() {
                        return Err(EngineError::Unavailable(response.error));
                    }
                }
                Ok(())
            }
        }
    }

    /// Changes the schema of tablet `id` through its log.
    pub async fn alter_schema(&self, id: &str, schema: &Schema) -> Result<()> {
        match self {
            TabletHost::Local(tserver) => tserver.replica(id)?.alter_schema(schema).await,
            TabletHost::Cluster(cluster) => {
                let schema_json = serde_json::to_string(schema)
                    .map_err(|e| EngineError::InvalidTable(e.to_string()))?;
                cluster
                    .call_leader(id, || {
                        request::Kind::AlterSchema(AlterSchema {
                            tablet_id: id.into(),
                            schema_json: schema_json.clone(),
                        })
                    })
                    .await
                    .map(drop)
            }
        }
    }

    /// Applies one write batch to tablet `id` (on its leader); the rows applied.
    pub async fn write(&self, id: &str, batch: &WriteBatch) -> Result<usize> {
        match self {
            TabletHost::Local(tserver) => {
                tserver.admit_write().await?;
                tserver.replica(id)?.write(batch).await
            }
            TabletHost::Cluster(cluster) => {
                let encoded = batch.encode();
                let response = cluster
                    .call_leader(id, || {
                        request::Kind::Write(Write {
                            tablet_id: id.into(),
                            batch: encoded.clone(),
                        })
                    })
                    .await?;
                Ok(response.rows as usize)
            }
        }
    }

    /// Scans tablet `id` at `snapshot` (None: its leader's safe snapshot).
    pub fn scan(
        &self,
        id: &str,
        mut spec: ScanSpec,
        snapshot: Option<Timestamp>,
    ) -> Result<ScanIterator> {
        match self {
            TabletHost::Local(tserver) => tserver.replica(id)?.scan(spec, snapshot),
            TabletHost::Cluster(cluster) => {
                spec.snapshot = snapshot.unwrap_or(Timestamp(0));
                Ok(Box::new(RemoteScan {
                    cluster: cluster.clone(),
                    tablet: id.to_string(),
                    spec: Some(spec),
                    scanner: None,
                    batches: std::collections::VecDeque::new(),
                }))
            }
        }
    }

    /// The newest snapshot at which tablet `id` has applied every write it will take below it.
    pub fn safe_snapshot(&self, id: &str) -> Result<Timestamp> {
        match self {
            TabletHost::Local(tserver) => Ok(tserver.replica(id)?.safe_snapshot()),
            TabletHost::Cluster(cluster) => {
                let response = cluster.blocking(cluster.call_leader(id, || {
                    request::Kind::SafeSnapshot(TabletRef {
                        tablet_id: id.into(),
                    })
                }))?;
                Ok(Timestamp(response.snapshot))
            }
        }
    }

    /// The size and shape of tablet `id` (in a cluster: as its leader last reported).
    pub fn stats(&self, id: &str) -> Result<TabletStats> {
        match self {
            TabletHost::Local(tserver) => {
                let replica = tserver.replica(id)?;
                let tablet = replica.tablet();
                Ok(TabletStats {
                    id: id.to_string(),
                    estimated_rows: tablet.estimated_rows(),
                    disk_bytes: tablet.disk_bytes(),
                    memory_bytes: tablet.memory_bytes(),
                    rowsets: tablet.rowset_count(),
                    delta_files: tablet.delta_file_count(),
                    column_files: tablet.column_file_count(),
                    compactions: tablet.compactions(),
                    leader: "local".into(),
                    replicas: 1,
                })
            }
            TabletHost::Cluster(cluster) => Ok(cluster.stats(id)),
        }
    }
}

/// What the master knows of one tablet server.
struct ServerEntry {
    address: String,
    last_seen: Instant,
    status: ServerStatus,
}

/// The tablet servers of a cluster, as their heartbeats describe them.
pub struct Cluster {
    servers: RwLock<BTreeMap<u64, ServerEntry>>,
    /// Since when each tablet's leader has reported a member it does not hear from, by
    /// (tablet, server).
    inactive_since: RwLock<HashMap<(String, u64), Instant>>,
    /// The leader each tablet had when last asked, by tablet id.
    leaders: RwLock<HashMap<String, u64>>,
    clients: Mutex<HashMap<String, RpcClient>>,
    /// Notified after every report, for those who wait for what reports tell (a tablet's
    /// leader, how far a replica has applied).
    reported: tokio::sync::Notify,
    /// Replicas of a new tablet when CREATE TABLE does not say.
    default_replicas: usize,
    runtime: tokio::runtime::Handle,
}

impl Cluster {
    pub fn new(default_replicas: usize, runtime: tokio::runtime::Handle) -> Arc<Self> {
        Arc::new(Self {
            servers: RwLock::default(),
            inactive_since: RwLock::default(),
            leaders: RwLock::default(),
            clients: Mutex::default(),
            reported: tokio::sync::Notify::new(),
            default_replicas: default_replicas.max(1),
            runtime,
        })
    }

    /// Records a tablet server's heartbeat.
    pub fn heartbeat(&self, address: String, status: ServerStatus) {
        self.report(address, status, true, &[]);
    }

    /// Records a tablet server's report: its full status, or (`full` false) the replicas that
    /// changed since its last report and those it no longer holds. Returns false if an
    /// incremental report came from a server this master does not know: it must send a full
    /// one.
    pub fn report(
        &self,
        address: String,
        status: ServerStatus,
        full: bool,
        removed: &[String],
    ) -> bool {
        let mut servers = self.servers.write();
        let entry = match servers.get_mut(&status.server_id) {
            Some(entry) if !full => entry,
            None if !full => return false,
            _ => servers.entry(status.server_id).or_insert(ServerEntry {
                address: address.clone(),
                last_seen: Instant::now(),
                status: ServerStatus {
                    server_id: status.server_id,
                    replicas: vec![],
                },
            }),
        };
        if full {
            entry.status.replicas.clear();
        }
        entry.address = address;
        entry.last_seen = Instant::now();
        entry.status.replicas.retain(|r| {
            !removed.contains(&r.tablet_id)
                && !status.replicas.iter().any(|n| n.tablet_id == r.tablet_id)
        });
        entry
            .status
            .replicas
            .extend(status.replicas.iter().cloned());
        drop(servers);
        let mut leaders = self.leaders.write();
        let mut inactive = self.inactive_since.write();
        for replica in &status.replicas {
            if replica.leader != 0 {
                leaders.insert(replica.tablet_id.clone(), replica.leader);
            }
            if replica.leader == status.server_id {
                inactive
                    .retain(|(t, s), _| *t != replica.tablet_id || replica.inactive.contains(s));
                for &member in &replica.inactive {
                    inactive
                        .entry((replica.tablet_id.clone(), member))
                        .or_insert_with(Instant::now);
                }
            }
        }
        drop((leaders, inactive));
        self.reported.notify_waiters();
        true
    }

    /// Resolves after the next report. Enable it (see [`tokio::sync::Notified::enable`])
    /// before looking at what reports told so far, so a report in between is not missed.
    pub fn report_received(&self) -> tokio::sync::futures::Notified<'_> {
        self.reported.notified()
    }

    /// Every live server's address and last heartbeat (for coordinators that are not masters).
    pub fn view(&self) -> Vec<crate::rpc::Heartbeat> {
        self.servers
            .read()
            .values()
            .filter(|s| s.last_seen.elapsed() < SERVER_TIMEOUT)
            .map(|s| crate::rpc::Heartbeat {
                address: s.address.clone(),
                status: Some(s.status.clone()),
                full: true,
                removed: vec![],
            })
            .collect()
    }

    /// The servers heard from recently: (id, address, replicas held).
    pub fn live_servers(&self) -> Vec<(u64, String, usize)> {
        self.servers
            .read()
            .iter()
            .filter(|(_, s)| s.last_seen.elapsed() < SERVER_TIMEOUT)
            .map(|(id, s)| (*id, s.address.clone(), s.status.replicas.len()))
            .collect()
    }

    /// How long ago server `id` was last heard from (None: never).
    pub fn silent_for(&self, id: u64) -> Option<Duration> {
        self.servers.read().get(&id).map(|s| s.last_seen.elapsed())
    }

    /// How long the leader of `tablet` has not heard from its member `server` (None: it
    /// does).
    pub fn unreachable_for(&self, tablet: &str, server: u64) -> Option<Duration> {
        self.inactive_since
            .read()
            .get(&(tablet.to_string(), server))
            .map(Instant::elapsed)
    }

    /// The leader of `tablet` as heartbeats last reported it.
    pub fn leader_of(&self, tablet: &str) -> Option<u64> {
        self.leaders.read().get(tablet).copied()
    }

    /// Every replica server `id` last reported.
    pub fn replicas_of(&self, id: u64) -> Vec<crate::rpc::ReplicaStatus> {
        self.servers
            .read()
            .get(&id)
            .map(|s| s.status.replicas.clone())
            .unwrap_or_default()
    }

    /// What server `id` last reported of its replica of `tablet`.
    pub fn replica_status(&self, id: u64, tablet: &str) -> Option<crate::rpc::ReplicaStatus> {
        let servers = self.servers.read();
        let status = &servers.get(&id)?.status;
        status
            .replicas
            .iter()
            .find(|r| r.tablet_id == tablet)
            .cloned()
    }

    pub(crate) fn address(&self, server: u64) -> Result<String> {
        self.servers
            .read()
            .get(&server)
            .map(|s| s.address.clone())
            .ok_or_else(|| EngineError::Unavailable(format!("tablet server {server} is unknown")))
    }

    async fn client(&self, address: &str) -> Result<RpcClient> {
        if let Some(client) = self.clients.lock().get(address) {
            return Ok(client.clone());
        }
        let client = RpcClient::connect(address).await?;
        self.clients
            .lock()
            .insert(address.to_string(), client.clone());
        Ok(client)
    }

    pub(crate) async fn call_server(
        &self,
        server: u64,
        kind: request::Kind,
    ) -> Result<RpcResponse> {
        let address = self.address(server)?;
        self.call_address(&address, kind).await
    }

    /// Sends a request to the server at `address` over the connection kept for it (made
    /// again after an error).
    pub(crate) async fn call_address(
        &self,
        address: &str,
        kind: request::Kind,
    ) -> Result<RpcResponse> {
        let result = self.client(address).await?.call(kind).await;
        if result.is_err() {
            self.clients.lock().remove(address);
        }
        result
    }

    /// Runs `future` to completion from synchronous code on a runtime thread.
    fn blocking<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        tokio::task::block_in_place(|| self.runtime.block_on(future))
    }

    /// Sends the request `make` builds to the leader of `tablet`, following NotLeader hints and
    /// retrying while a leader is elected; an error after [`LEADER_DEADLINE`].
    pub(crate) async fn call_leader(
        &self,
        tablet: &str,
        make: impl Fn() -> request::Kind,
    ) -> Result<RpcResponse> {
        let started = Instant::now();
        let mut last_error = String::from("no leader known");
        while started.elapsed() < LEADER_DEADLINE {
            let reported = self.report_received();
            let mut reported = std::pin::pin!(reported);
            reported.as_mut().enable();
            let leader = self.leaders.read().get(tablet).copied();
            let Some(leader) = leader else {
                // Until a server's report names one.
                let left = LEADER_DEADLINE.saturating_sub(started.elapsed());
                let _ = tokio::time::timeout(left, reported).await;
                continue;
            };
            match self.call_server(leader, make()).await {
                Ok(response) if response.error.is_empty() => return Ok(response),
                Ok(response) if response.not_leader => {
                    let mut leaders = self.leaders.write();
                    if response.leader_hint != 0 && response.leader_hint != leader {
                        leaders.insert(tablet.to_string(), response.leader_hint);
                    } else {
                        leaders.remove(tablet);
                    }
                    last_error = response.error;
                }
                Ok(response) => return Err(EngineError::Remote(response.error)),
                Err(e) => {
                    // The leader is unreachable: wait for the next one to be reported.
                    self.leaders.write().remove(tablet);
                    last_error = e.to_string();
                }
            }
            // Before asking again, even a named leader: hints may be stale for a while.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(EngineError::Unavailable(format!(
            "tablet {tablet} has no reachable leader: {last_error}"
        )))
    }

    async fn create_tablet(&self, id: &str, schema: &Schema, replicas: usize) -> Result<Vec<u64>> {
        let replicas = match replicas {
            0 => self.default_replicas.min(self.live_servers().len().max(1)),
            n => n,
        };
        let mut live = self.live_servers();
        if live.len() < replicas {
            return Err(EngineError::InvalidTable(format!(
                "replicas = {replicas}: only {} tablet server(s) are alive",
                live.len()
            )));
        }
        // The least loaded servers first.
        live.sort_by_key(|(id, _, held)| (*held, *id));
        live.truncate(replicas);
        let peers: Vec<Peer> = live
            .iter()
            .map(|(server_id, address, _)| Peer {
                server_id: *server_id,
                address: address.clone(),
            })
            .collect();
        let schema_json =
            serde_json::to_string(schema).map_err(|e| EngineError::InvalidTable(e.to_string()))?;
        for (server, _, _) in &live {
            let response = self
                .call_server(
                    *server,
                    request::Kind::CreateReplica(CreateReplica {
                        tablet_id: id.into(),
                        schema_json: schema_json.clone(),
                        peers: peers.clone(),
                    }),
                )
                .await?;
            if !response.error.is_empty() {
                return Err(EngineError::Remote(response.error));
            }
            // Count it now, so the next tablet of the same table goes elsewhere.
            if let Some(entry) = self.servers.write().get_mut(server) {
                entry.status.replicas.push(crate::rpc::ReplicaStatus {
                    tablet_id: id.into(),
                    ..Default::default()
                });
            }
        }
        Ok(live.into_iter().map(|(id, _, _)| id).collect())
    }

    fn stats(&self, id: &str) -> TabletStats {
        let servers = self.servers.read();
        let leader = self.leaders.read().get(id).copied();
        let mut stats = TabletStats {
            id: id.to_string(),
            leader: leader
                .and_then(|l| servers.get(&l))
                .map(|s| s.address.clone())
                .unwrap_or_default(),
            ..TabletStats::default()
        };
        let live = servers
            .values()
            .filter(|s| s.last_seen.elapsed() < SERVER_TIMEOUT);
        for server in live {
            if let Some(r) = server.status.replicas.iter().find(|r| r.tablet_id == id) {
                stats.replicas += 1;
                if Some(server.status.server_id) == leader {
                    stats.estimated_rows = r.estimated_rows as usize;
                    stats.disk_bytes = r.disk_bytes;
                }
            }
        }
        stats
    }
}

/// A scan of a tablet on its leader through a scanner; opened at the first batch asked for
/// (on a blocking thread), then continued chunk by chunk.
struct RemoteScan {
    cluster: Arc<Cluster>,
    tablet: String,
    spec: Option<ScanSpec>,
    scanner: Option<(u64, u64)>, // (server, scanner id)
    batches: std::collections::VecDeque<RecordBatch>,
}

impl RemoteScan {
    fn fetch(&mut self) -> Result<bool> {
        let response = if let Some(spec) = self.spec.take() {
            let encoded = spec.encode()?;
            let tablet = self.tablet.clone();
            let cluster = self.cluster.clone();
            let response = cluster.blocking(cluster.call_leader(&tablet, || {
                request::Kind::ScanOpen(ScanOpen {
                    tablet_id: tablet.clone(),
                    spec: encoded.clone(),
                })
            }))?;
            let leader = self
                .cluster
                .leaders
                .read()
                .get(&self.tablet)
                .copied()
                .unwrap_or(0);
            self.scanner = Some((leader, response.scanner_id));
            response
        } else {
            let Some((server, scanner_id)) = self.scanner else {
                return Ok(false);
            };
            let cluster = self.cluster.clone();
            let response = cluster.blocking(
                cluster.call_server(server, request::Kind::ScanNext(ScanNext { scanner_id })),
            )?;
            if !response.error.is_empty() {
                return Err(EngineError::Remote(response.error));
            }
            response
        };
        if !response.ipc.is_empty() {
            let reader = arrow::ipc::reader::StreamReader::try_new(
                std::io::Cursor::new(response.ipc),
                None,
            )?;
            for batch in reader {
                self.batches.push_back(batch?);
            }
        }
        if response.done {
            self.scanner = None;
        }
        Ok(true)
    }
}

impl Iterator for RemoteScan {
    type Item = std::result::Result<RecordBatch, nyala_storage::StorageError>;

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
                return Some(Err(nyala_storage::StorageError::Io(std::io::Error::other(
                    e.to_string(),
                ))));
            }
        }
    }
}
