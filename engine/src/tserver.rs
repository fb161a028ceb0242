//! The tablet server: hosts tablet replicas under `<dir>/tablets/<tablet id>/` and runs their
//! maintenance: flushing MemRowSets that grew past their threshold (which also lets the Raft log
//! behind them be dropped) and, while the memory of all tablets together is above 60 % of the
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
use crate::replica::TabletReplica;
use crate::{EngineError, Result};

const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(200);
/// How long a write waits for memory before it is refused.
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(60);
/// Default limit on the in-memory data (MemRowSets and deltas) of all tablets of a server.
pub const DEFAULT_MEMORY_LIMIT: usize = 2 << 30;

pub struct TabletServer {
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
    pub fn open(
        dir: &Path,
        options: TabletOptions,
        memory_limit: usize,
        clock: Arc<HybridClock>,
    ) -> Result<Arc<Self>> {
        let tablets_dir = dir.join("tablets");
        std::fs::create_dir_all(&tablets_dir)?;
        let mut replicas = HashMap::new();
        for entry in std::fs::read_dir(&tablets_dir)? {
            let entry = entry?;
            let Some(id) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if id.starts_with('.') || !entry.file_type()?.is_dir() {
                continue;
            }
            let replica = TabletReplica::open(&entry.path(), &id, options.clone(), clock.clone())?;
            tracing::debug!(tablet = %id, "opened tablet replica");
            replicas.insert(id, Arc::new(replica));
        }
        let server = Arc::new(Self {
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

    /// One round of background work: flush every tablet whose MemRowSet is over its threshold,
    /// then, largest first, tablets until the server's memory is below 60 % of its limit.
    fn run_maintenance(&self) {
        let replicas: Vec<_> = self.replicas.read().values().cloned().collect();
        let flush = |replica: &TabletReplica| {
            if let Err(e) = replica.flush() {
                tracing::error!(tablet = replica.id(), error = %e, "flush failed");
            }
        };
        for replica in &replicas {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            if replica.tablet().needs_flush() {
                flush(replica);
            }
        }
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
            flush(replica);
            total -= bytes;
        }
        let best = replicas
            .iter()
            .filter_map(|r| Some((r, r.tablet().maintenance_ops().into_iter().next()?)))
            .max_by(|a, b| a.1.score.total_cmp(&b.1.score));
        if let Some((replica, op)) = best.filter(|(_, op)| op.score >= 1.0) {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            tracing::debug!(tablet = replica.id(), ?op, "compacting");
            if let Err(e) = replica.compact(op.kind) {
                tracing::error!(tablet = replica.id(), error = %e, "compaction failed");
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
        let mut replicas = self.replicas.write();
        if let Some(existing) = replicas.get(id) {
            return Ok(existing.clone());
        }
        let dir = self.tablets_dir.join(id);
        // A directory left by a crash half-way through an earlier creation holds nothing acknowledged.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let replica = Arc::new(TabletReplica::create(
            &dir,
            id,
            schema.clone(),
            self.options.clone(),
            self.clock.clone(),
        )?);
        replicas.insert(id.to_string(), replica.clone());
        Ok(replica)
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
