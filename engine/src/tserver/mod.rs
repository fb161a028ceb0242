//! The tablet server: hosts tablet replicas under `<dir>/tablets/<tablet id>/`, has the
//! [`MaintenanceManager`] flush and compact them, and holds writers back while the in-memory
//! data of all its tablets is above the server's limit.
//!
//! - [`replica`]: one tablet behind its Raft log (writes proposed, applied deterministically).
//! - [`maintenance`]: the thread that flushes and compacts the server's tablets.
//! - [`metrics`]: the server's replicas as metrics, read when `/metrics` is scraped.
//! - [`service`]: the tablet server's RPC service (writes, scans, replica lifecycle), with
//!   [`scanners`] (open scans) and [`tablet_copy`] (both ends of copying a replica).
//! - [`heartbeater`]: the reports this server sends to the masters.

pub mod heartbeater;
pub mod maintenance;
pub mod metrics;
pub mod replica;
pub mod scanners;
pub mod service;
pub mod tablet_copy;
pub mod txns;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nyala_storage::{Schema, TabletOptions};
use parking_lot::RwLock;

use crate::clock::HybridClock;
use crate::consensus::{RaftGroups, RaftRouter};
use crate::rpc::proto::common::{ReplicaStatus, ServerStatus};
use crate::{EngineError, Result};
use maintenance::MaintenanceManager;
use replica::{CopyPosition, Peers, Replication, TabletReplica};

/// How long a write waits for memory before it is refused.
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long opening a clone waits for the source replica to apply the clone's log entry.
const CLONE_APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default limit on the in-memory data (MemRowSets and deltas) of all tablets of a server.
pub const DEFAULT_MEMORY_LIMIT: usize = 2 << 30;

/// A tablet server: the replicas in one data directory, and their maintenance.
///
/// ```
/// # use std::sync::Arc;
/// # use arrow::array::{Int64Array, RecordBatch};
/// # use nyala_engine::clock::HybridClock;
/// # use nyala_engine::storage::{ColumnSchema, ColumnType, Schema, TabletOptions, WriteBatch, WriteKind};
/// # use nyala_engine::tserver::{TabletServer, DEFAULT_MEMORY_LIMIT};
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (dir, clock) = (tempfile::tempdir()?, Arc::new(HybridClock::new()));
/// # let schema = Schema::new(vec![ColumnSchema::new("id", ColumnType::Int64, false)], vec![0])?;
/// # let rows = RecordBatch::try_new(schema.arrow_schema(), vec![Arc::new(Int64Array::from(vec![1, 2]))])?;
/// # let batch = WriteBatch::new(WriteKind::Insert, rows);
/// let server = TabletServer::open(dir.path(), TabletOptions::default(), DEFAULT_MEMORY_LIMIT, clock, None)?;
/// server.create_tablet("t1", &schema)?;
/// let written = server.replica("t1")?.write(&batch).await?;
/// assert_eq!(written.rows, 2);
/// # server.shutdown()?;
/// # Ok(()) }
/// ```
pub struct TabletServer {
    /// This server's id, which is also its Raft node id in replicated tablets.
    server_id: u64,
    /// How replicas reach their peers (None for the embedded single node).
    router: Option<Arc<RaftRouter>>,
    tablets_dir: PathBuf,
    options: TabletOptions,
    clock: Arc<HybridClock>,
    replicas: RwLock<HashMap<String, Arc<TabletReplica>>>,
    maintenance: MaintenanceManager,
    memory_limit: usize,
    /// Held until the server shuts down (or is dropped).
    lock: parking_lot::Mutex<Option<crate::dir_lock::DirLock>>,
}

impl TabletServer {
    /// Opens every tablet replica found under `dir` and starts the maintenance thread.
    /// Replicated tablets need `router`, through which their replicas reach their peers.
    pub fn open(
        dir: &Path,
        options: TabletOptions,
        memory_limit: usize,
        clock: Arc<HybridClock>,
        router: Option<Arc<RaftRouter>>,
    ) -> Result<Arc<Self>> {
        let lock = crate::dir_lock::DirLock::acquire(dir)?;
        let tablets_dir = dir.join("tablets");
        std::fs::create_dir_all(&tablets_dir)?;
        let server_id = server_id(dir)?;
        let maintenance = MaintenanceManager::new();
        let mut replicas = HashMap::new();
        replica::remove_staging(&tablets_dir)?;
        for entry in std::fs::read_dir(&tablets_dir)? {
            let entry = entry?;
            let Some(id) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if id.starts_with('.') || !entry.file_type()?.is_dir() {
                continue;
            }
            let replication = match TabletReplica::peers(&entry.path())? {
                None => None,
                Some(peers) => {
                    let router = router.as_ref().ok_or_else(|| {
                        EngineError::Unsupported(format!(
                            "tablet {id} is replicated; open this data directory with `nyala tserver`"
                        ))
                    })?;
                    router.learn(&peers.addresses);
                    Some(Replication {
                        server_id,
                        peers,
                        transport: router.transport(&id),
                        learn: Some(router.learner()),
                        followers_serve_reads: false,
                    })
                }
            };
            let replica = TabletReplica::open(
                &entry.path(),
                &id,
                options.clone(),
                clock.clone(),
                replication,
                Some(maintenance.signal().clone()),
            )
            .map_err(|e| EngineError::OpenReplica {
                tablet: id.clone(),
                dir: entry.path().display().to_string(),
                source: Box::new(e),
            })?;
            tracing::debug!(tablet = %id, "opened tablet replica");
            replicas.insert(id, Arc::new(replica));
        }
        let server = Arc::new(Self {
            server_id,
            router,
            tablets_dir,
            options,
            clock,
            replicas: RwLock::new(replicas),
            maintenance,
            memory_limit: memory_limit.max(1),
            lock: parking_lot::Mutex::new(Some(lock)),
        });
        server.maintenance.start(Arc::downgrade(&server))?;
        Ok(server)
    }

    /// The maintenance thread: what it runs and ran.
    pub fn maintenance_log(&self) -> &maintenance::MaintenanceLog {
        self.maintenance.log()
    }

    /// Every flush and compaction of this server's replicas, with its score now.
    pub fn maintenance_candidates(&self) -> Vec<maintenance::MaintenanceCandidate> {
        maintenance::candidates(&self.replicas(), self.maintenance.signal())
    }

    /// Every replica on this server.
    pub fn replicas(&self) -> Vec<Arc<TabletReplica>> {
        self.replicas.read().values().cloned().collect()
    }

    /// The most in-memory data its tablets may hold together before writers wait.
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// The in-memory data (MemRowSets and deltas) of all tablets.
    pub fn memory_bytes(&self) -> usize {
        self.replicas
            .read()
            .values()
            .map(|r| r.tablet().memory_bytes())
            .sum()
    }

    /// Waits until the tablets' memory is below the limit (back-pressure on writers); an error
    /// if flushing does not bring it there in time.
    pub async fn admit_write(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + ADMISSION_TIMEOUT;
        let signal = self.maintenance.signal();
        loop {
            let flushed = signal.flushed();
            let mut flushed = std::pin::pin!(flushed);
            // Listening before looking: a flush in between wakes this writer.
            flushed.as_mut().enable();
            let used = self.memory_bytes();
            if used <= self.memory_limit {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                crate::metrics::engine().writes_rejected.inc();
                return Err(EngineError::Busy(format!(
                    "the server holds {} MiB of unflushed data, over its limit of {} MiB, and \
                     flushing has not caught up; retry the write later",
                    used >> 20,
                    self.memory_limit >> 20
                )));
            }
            signal.memory_wanted();
            let _ = tokio::time::timeout_at(deadline, flushed).await;
        }
    }

    /// Creates an empty tablet replica; creating one that exists is a no-op.
    pub fn create_tablet(&self, id: &str, schema: &Schema) -> Result<Arc<TabletReplica>> {
        self.create(id, schema, None)
    }

    /// How this server's replica of tablet `id` reaches its `peers`.
    fn replication(&self, id: &str, peers: Peers) -> Result<Replication> {
        let router = self.router.as_ref().ok_or_else(|| {
            EngineError::Unsupported("this server does not replicate tablets".into())
        })?;
        router.learn(&peers.addresses);
        Ok(Replication {
            server_id: self.server_id,
            peers,
            transport: router.transport(id),
            learn: Some(router.learner()),
            followers_serve_reads: false,
        })
    }

    /// Creates this server's replica of a tablet replicated among `peers` (which must include
    /// this server); creating one that exists is a no-op.
    pub fn create_replicated_tablet(
        &self,
        id: &str,
        schema: &Schema,
        peers: Peers,
    ) -> Result<Arc<TabletReplica>> {
        if !peers.voters.contains(&self.server_id) {
            return Err(EngineError::InvalidTable(format!(
                "tablet {id}: server {} is not among its replicas {:?}",
                self.server_id, peers.voters
            )));
        }
        self.create(id, schema, Some(peers))
    }

    fn create(
        &self,
        id: &str,
        schema: &Schema,
        peers: Option<Peers>,
    ) -> Result<Arc<TabletReplica>> {
        let mut replicas = self.replicas.write();
        if let Some(existing) = replicas.get(id) {
            return Ok(existing.clone());
        }
        let dir = self.tablets_dir.join(id);
        // A replica not open here but with a directory failed to open: not this replica.
        replica::discard(&dir)?;
        let replication = peers.map(|p| self.replication(id, p)).transpose()?;
        let replica = Arc::new(TabletReplica::create(
            &dir,
            id,
            schema.clone(),
            self.options.clone(),
            self.clock.clone(),
            replication,
            Some(self.maintenance.signal().clone()),
        )?);
        replicas.insert(id.to_string(), replica.clone());
        Ok(replica)
    }

    /// Where the files of a tablet copy being received are put (a directory `open` skips,
    /// and removes).
    pub fn staging_dir(&self, id: &str) -> PathBuf {
        replica::beside(&self.tablets_dir.join(id), "copy")
    }

    /// Creates this server's replica of tablet `id` from the files copied into
    /// [`Self::staging_dir`] (taken on another replica of the group `peers` describes, at
    /// `copy`); it joins the group as a learner.
    pub fn install_replica(&self, id: &str, copy: CopyPosition, peers: Peers) -> Result<()> {
        let mut replicas = self.replicas.write();
        if replicas.contains_key(id) {
            return Err(EngineError::InvalidTable(format!(
                "tablet {id} already has a replica on this server"
            )));
        }
        let dir = self.tablets_dir.join(id);
        replica::discard(&dir)?;
        let replication = self.replication(id, peers)?;
        let replica = TabletReplica::install(
            &dir,
            id,
            &self.staging_dir(id),
            copy,
            self.options.clone(),
            self.clock.clone(),
            replication,
            Some(self.maintenance.signal().clone()),
        )
        .inspect_err(|_| {
            let _ = replica::discard(&dir);
        })?;
        replicas.insert(id.to_string(), Arc::new(replica));
        Ok(())
    }

    /// Opens tablet `id`, the clone of tablet `source` that this server's replica of it
    /// staged on applying log entry `index` or before (see [`TabletReplica::clone_to`]), as a
    /// replica among `peers` (None: a single voter). Waits for the source replica to apply
    /// that far; opening one that exists is a no-op.
    pub async fn open_clone(
        self: &Arc<Self>,
        id: &str,
        source: &str,
        index: u64,
        peers: Option<Peers>,
    ) -> Result<()> {
        let replica = self.replica(source)?;
        let deadline = tokio::time::Instant::now() + CLONE_APPLY_TIMEOUT;
        while replica.last_applied() < index {
            if tokio::time::Instant::now() >= deadline {
                return Err(EngineError::Busy(format!(
                    "the replica of tablet {source} on server {} has not applied the clone in {} s",
                    self.server_id,
                    CLONE_APPLY_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (server, id) = (self.clone(), id.to_string());
        let source = source.to_string();
        crate::rpc::blocking(move || {
            let mut replicas = server.replicas.write();
            if replicas.contains_key(&id) {
                return Ok(());
            }
            let staging = replica::clone_staging_dir(&server.tablets_dir, &id);
            if !staging.join("data").join("metadata").exists() {
                return Err(EngineError::InvalidTable(format!(
                    "tablet {source} has no clone {id} on server {} (its replica there may have \
                     been copied from another since)",
                    server.server_id
                )));
            }
            let dir = server.tablets_dir.join(&id);
            let replication = peers.map(|p| server.replication(&id, p)).transpose()?;
            let opened = TabletReplica::open_clone(
                &staging,
                &dir,
                &id,
                server.options.clone(),
                server.clock.clone(),
                replication,
                Some(server.maintenance.signal().clone()),
            );
            let opened = opened.inspect_err(|_| {
                let _ = replica::discard(&dir);
            })?;
            replicas.insert(id, Arc::new(opened));
            Ok(())
        })
        .await
    }

    pub fn server_id(&self) -> u64 {
        self.server_id
    }

    /// Records where server `id` listens.
    pub fn learn_address(&self, id: u64, address: String) {
        if let Some(router) = &self.router {
            router.learn(&std::collections::BTreeMap::from([(id, address)]));
        }
    }

    /// Where server `id` listens, if this server knows.
    pub fn address_of(&self, id: u64) -> Option<String> {
        self.router.as_ref()?.address(id)
    }

    /// Every replica on this server: its leader, how far it has applied, its size.
    pub fn status(&self) -> ServerStatus {
        let mut replicas: Vec<ReplicaStatus> = self
            .replicas
            .read()
            .iter()
            .map(|(id, r)| {
                let group = r.group_state();
                ReplicaStatus {
                    tablet_id: id.clone(),
                    leader: r.leader().unwrap_or(0),
                    last_applied: r.last_applied(),
                    estimated_rows: r.tablet().estimated_rows() as u64,
                    voters: group.voters,
                    learners: group.learners,
                    commit: group.commit,
                    disk_bytes: r.tablet().disk_bytes(),
                    inactive: group.inactive,
                }
            })
            .collect();
        replicas.sort_by(|a, b| a.tablet_id.cmp(&b.tablet_id));
        ServerStatus {
            server_id: self.server_id,
            replicas,
        }
    }

    /// Stops a tablet replica and deletes its data.
    pub fn delete_tablet(&self, id: &str) -> Result<()> {
        let replica = self.replicas.write().remove(id);
        if let Some(replica) = replica {
            replica.stop();
            replica::discard(replica.dir())?;
        }
        Ok(())
    }

    pub fn replica(&self, id: &str) -> Result<Arc<TabletReplica>> {
        self.replicas
            .read()
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::TabletNotFound(id.to_string()))
    }

    pub fn tablet_ids(&self) -> Vec<String> {
        self.replicas.read().keys().cloned().collect()
    }

    /// Stops maintenance, then flushes and stops every replica.
    pub fn shutdown(&self) -> Result<()> {
        self.maintenance.stop();
        let replicas: Vec<_> = self.replicas.write().drain().map(|(_, r)| r).collect();
        let mut first_error = None;
        for replica in replicas {
            if let Err(e) = replica.shutdown() {
                tracing::error!(tablet = replica.id(), error = %e, "shutdown flush failed");
                first_error.get_or_insert(e);
            }
        }
        // The directory may be opened again.
        self.lock.lock().take();
        first_error.map_or(Ok(()), Err)
    }
}

impl RaftGroups for TabletServer {
    fn step(&self, tablet_id: &str, message: nyala_raft::Message) -> Option<nyala_raft::Message> {
        match self.replicas.read().get(tablet_id) {
            Some(replica) => {
                replica.step(message);
                None
            }
            None => Some(message),
        }
    }
}

/// The id of the server whose data directory is `dir`: chosen at random when it is first used,
/// then kept in `dir/server_id`.
fn server_id(dir: &Path) -> Result<u64> {
    let path = dir.join("server_id");
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|_| {
            EngineError::CatalogCorrupted(format!("{} does not hold a server id", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Non-zero (Raft reserves 0) and below 2^53 (exact in JSON numbers).
            let id = (uuid::Uuid::new_v4().as_u128() as u64 & ((1 << 53) - 1)).max(1);
            let tmp = dir.join("server_id.tmp");
            std::fs::write(&tmp, id.to_string())?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            Ok(id)
        }
        Err(e) => Err(e.into()),
    }
}
