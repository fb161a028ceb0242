//! The tablet server: hosts tablet replicas under `<dir>/tablets/<tablet id>/` and runs their
//! maintenance (for now: flushing MemRowSets that grew past their threshold, which also lets the
//! Raft log behind them be dropped).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nyala_storage::{Schema, TabletOptions};
use parking_lot::{Mutex, RwLock};

use crate::clock::HybridClock;
use crate::replica::TabletReplica;
use crate::{EngineError, Result};

const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(200);

pub struct TabletServer {
    tablets_dir: PathBuf,
    options: TabletOptions,
    clock: Arc<HybridClock>,
    replicas: RwLock<HashMap<String, Arc<TabletReplica>>>,
    stopping: Arc<AtomicBool>,
    maintenance: Mutex<Option<JoinHandle<()>>>,
}

impl TabletServer {
    /// Opens every tablet replica found under `dir` and starts the maintenance thread.
    pub fn open(dir: &Path, options: TabletOptions, clock: Arc<HybridClock>) -> Result<Arc<Self>> {
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
        });
        let weak = Arc::downgrade(&server);
        let stopping = server.stopping.clone();
        let handle = std::thread::Builder::new()
            .name("maintenance".into())
            .spawn(move || {
                while !stopping.load(Ordering::Acquire) {
                    std::thread::sleep(MAINTENANCE_INTERVAL);
                    let Some(server) = weak.upgrade() else { break };
                    server.run_maintenance();
                }
            })?;
        *server.maintenance.lock() = Some(handle);
        Ok(server)
    }

    /// One round of background work: flush every tablet whose MemRowSet is over its threshold.
    fn run_maintenance(&self) {
        let replicas: Vec<_> = self.replicas.read().values().cloned().collect();
        for replica in replicas {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            if replica.tablet().needs_flush() {
                if let Err(e) = replica.flush() {
                    tracing::error!(tablet = replica.id(), error = %e, "flush failed");
                }
            }
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
