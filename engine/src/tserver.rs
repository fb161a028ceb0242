//! The tablet server: hosts tablet replicas under `<dir>/tablets/<tablet id>/` and runs their
//! maintenance: flushing MemRowSets that grew past their threshold or whose log grew past 256 MB
//! (a flush lets the Raft log behind it be dropped) and, while the memory of all tablets together is above 60 % of the
//! server's limit, flushing the tablet holding the most. Writers wait while that memory is above
//! the limit itself, so it stays bounded however many tablets are written. Then, each round, the
//! compaction with the best score over all tablets runs (see
//! [`nyala_storage::Tablet::maintenance_ops`]), if it is worth its I/O.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nyala_storage::{Schema, TabletOptions};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::clock::HybridClock;
use crate::replica::{CopyPosition, Peers, Replication, TabletReplica};
use crate::rpc::{RaftRouter, ReplicaStatus, ServerStatus};
use crate::{EngineError, Result};

const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(200);
/// A replica whose log takes more than this on disk is flushed, so the log can be truncated.
const LOG_RETENTION_BYTES: u64 = 256 << 20;
/// The most flushes and compactions one maintenance round runs (besides memory-pressure flushes).
const MAINTENANCE_OPS_PER_ROUND: usize = 4;
/// How long a write waits for memory before it is refused.
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(60);
/// Default limit on the in-memory data (MemRowSets and deltas) of all tablets of a server.
pub const DEFAULT_MEMORY_LIMIT: usize = 2 << 30;

pub struct TabletServer {
    /// This server's id, which is also its Raft node id in replicated tablets.
    server_id: u64,
    /// How replicas reach their peers (None for the embedded single node).
    router: Option<Arc<RaftRouter>>,
    tablets_dir: PathBuf,
    options: TabletOptions,
    clock: Arc<HybridClock>,
    replicas: RwLock<HashMap<String, Arc<TabletReplica>>>,
    stopping: Arc<AtomicBool>,
    maintenance: Mutex<Option<JoinHandle<()>>>,
    memory_limit: usize,
    /// Wakes the maintenance thread early when writers wait for memory.
    wake: Arc<(Mutex<bool>, Condvar)>,
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
        let tablets_dir = dir.join("tablets");
        std::fs::create_dir_all(&tablets_dir)?;
        let server_id = server_id(dir)?;
        let mut replicas = HashMap::new();
        for entry in std::fs::read_dir(&tablets_dir)? {
            let entry = entry?;
            let Some(id) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if id.starts_with(".copy-") {
                // A tablet copy a crash interrupted.
                std::fs::remove_dir_all(entry.path())?;
                continue;
            }
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
                    })
                }
            };
            let replica = TabletReplica::open(
                &entry.path(),
                &id,
                options.clone(),
                clock.clone(),
                replication,
            )?;
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
            stopping: Arc::new(AtomicBool::new(false)),
            maintenance: Mutex::new(None),
            memory_limit: memory_limit.max(1),
            wake: Arc::new((Mutex::new(false), Condvar::new())),
        });
        let weak = Arc::downgrade(&server);
        let stopping = server.stopping.clone();
        let wake = server.wake.clone();
        let handle = std::thread::Builder::new()
            .name("maintenance".into())
            .spawn(move || {
                while !stopping.load(Ordering::Acquire) {
                    {
                        let mut woken = wake.0.lock();
                        if !*woken {
                            wake.1.wait_for(&mut woken, MAINTENANCE_INTERVAL);
                        }
                        *woken = false;
                    }
                    let Some(server) = weak.upgrade() else { break };
                    server.run_maintenance();
                }
            })?;
        *server.maintenance.lock() = Some(handle);
        Ok(server)
    }

    /// One round of background work (Kudu's maintenance manager). Under memory pressure (over
    /// 60 % of the limit) the largest tablets are flushed first, until it is gone. Then the
    /// best-scoring operation over all tablets runs, again while the best scores at least 1, a
    /// few per round: a flush scores how full its tablet's memory is (1 at the flush threshold)
    /// or how long its log is (1 at 256 MB), a compaction its expected benefit.
    fn run_maintenance(&self) {
        let replicas: Vec<_> = self.replicas.read().values().cloned().collect();
        let mut by_memory: Vec<(usize, &Arc<TabletReplica>)> = replicas
            .iter()
            .map(|r| (r.tablet().memory_bytes(), r))
            .collect();
        by_memory.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
        let mut total: usize = by_memory.iter().map(|(bytes, _)| bytes).sum();
        for (bytes, replica) in by_memory {
            if total <= self.memory_limit / 10 * 6 || bytes == 0 {
                break;
            }
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            tracing::debug!(
                tablet = replica.id(),
                bytes,
                total,
                "flushing under memory pressure"
            );
            if let Err(e) = replica.flush() {
                tracing::error!(tablet = replica.id(), error = %e, "flush failed");
            }
            total -= bytes;
        }
        for _ in 0..MAINTENANCE_OPS_PER_ROUND {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let best = replicas
                .iter()
                .flat_map(|r| {
                    let tablet = r.tablet();
                    // A long log counts only while a flush would let some of it go.
                    let log = match tablet.memory_bytes() {
                        0 => 0.0,
                        _ => r.log_bytes() as f64 / LOG_RETENTION_BYTES as f64,
                    };
                    let flush = (None, tablet.flush_score().max(log));
                    let compactions = tablet.maintenance_ops().into_iter();
                    std::iter::once(flush)
                        .chain(compactions.map(|op| (Some(op.kind), op.score)))
                        .map(move |(kind, score)| (r, kind, score))
                })
                .max_by(|a, b| a.2.total_cmp(&b.2));
            let Some((replica, kind, score)) = best.filter(|best| best.2 >= 1.0) else {
                return;
            };
            tracing::debug!(tablet = replica.id(), ?kind, score, "maintenance");
            let done = match kind {
                None => replica.flush(),
                Some(kind) => replica.compact(kind),
            };
            if let Err(e) = done {
                tracing::error!(tablet = replica.id(), error = %e, "maintenance failed");
                return;
            }
        }
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
        let started = std::time::Instant::now();
        loop {
            let used = self.memory_bytes();
            if used <= self.memory_limit {
                return Ok(());
            }
            if started.elapsed() > ADMISSION_TIMEOUT {
                return Err(EngineError::Busy(format!(
                    "the server holds {} MiB of unflushed data, over its limit of {} MiB, and \
                     flushing has not caught up; retry the write later",
                    used >> 20,
                    self.memory_limit >> 20
                )));
            }
            *self.wake.0.lock() = true;
            self.wake.1.notify_one();
            tokio::time::sleep(Duration::from_millis(5)).await;
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
        // A directory left by a crash half-way through an earlier creation holds nothing acknowledged.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let replication = peers.map(|p| self.replication(id, p)).transpose()?;
        let replica = Arc::new(TabletReplica::create(
            &dir,
            id,
            schema.clone(),
            self.options.clone(),
            self.clock.clone(),
            replication,
        )?);
        replicas.insert(id.to_string(), replica.clone());
        Ok(replica)
    }

    /// Where the files of a tablet copy being received are put (a directory `open` skips,
    /// and removes).
    pub fn staging_dir(&self, id: &str) -> PathBuf {
        self.tablets_dir.join(format!(".copy-{id}"))
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
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        std::fs::rename(self.staging_dir(id), dir.join("data"))?;
        let replication = self.replication(id, peers)?;
        let replica = TabletReplica::install(
            &dir,
            id,
            copy,
            self.options.clone(),
            self.clock.clone(),
            replication,
        )
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        replicas.insert(id.to_string(), Arc::new(replica));
        Ok(())
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
            std::fs::remove_dir_all(replica.dir())?;
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
        self.stopping.store(true, Ordering::Release);
        self.wake.1.notify_one();
        if let Some(handle) = self.maintenance.lock().take() {
            let _ = handle.join();
        }
        let replicas: Vec<_> = self.replicas.write().drain().map(|(_, r)| r).collect();
        let mut first_error = None;
        for replica in replicas {
            if let Err(e) = replica.shutdown() {
                tracing::error!(tablet = replica.id(), error = %e, "shutdown flush failed");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for TabletServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
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
