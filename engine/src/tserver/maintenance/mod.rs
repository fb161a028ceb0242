//! The maintenance manager (Kudu's): one thread per tablet server that flushes and compacts the
//! server's tablets, and the signal that tells it when to look.
//!
//! A round flushes first what memory pressure asks for: while the in-memory data (MemRowSets
//! and deltas) of all tablets together is above 60 % of the server's limit, the tablet holding
//! the most is flushed. Then the best-scoring operation over all tablets runs, again while the
//! best scores at least 1, a few per round: a flush scores how full its tablet's memory is (1 at
//! the flush threshold), how long its log is (1 at 256 MB, as a flush lets the log behind it be
//! dropped) or whether it stopped taking writes (1 after [`IDLE_FLUSH_AFTER`] without one), a
//! compaction its expected benefit (see [`nyala_storage::Tablet::maintenance_ops`]).
//! Writers wait while the memory is above the limit itself ([`MaintenanceSignal::flushed`]), so
//! it stays bounded however many tablets are written.
//!
//! Rounds follow events, not a clock. Work appears when writes are applied, so every write a
//! replica applies (leader or follower) marks the server written ([`MaintenanceSignal::wrote`],
//! an atomic flag when already marked); a round follows, no sooner than [`ROUND_INTERVAL`] after
//! the previous one, so the writes of that interval are looked at together. A round that did
//! something is followed by another at that pace, since one operation may make the next
//! worthwhile. A writer waiting for memory gets a round at once, and is woken by each flush.
//! Without writes the thread sleeps for [`IDLE_FLUSH_AFTER`] while some tablet holds unflushed
//! data, else for [`IDLE_INTERVAL`]: all that appears then is history that ages past the
//! retention (UNDO files to trim, deletions to apply), which can wait that long.
//! An idle server's maintenance thread therefore wakes once a minute.
//!
//! What the thread does is kept for operators: the operation running now and the last
//! [`RECENT_OPS`] done ([`MaintenanceLog`]), each with its score and duration, and counted in
//! the engine's metrics.

pub(crate) mod signal;

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nyala_storage::MaintenanceKind;
use parking_lot::Mutex;

use crate::tserver::replica::TabletReplica;
use crate::tserver::TabletServer;
pub use signal::{MaintenanceSignal, IDLE_FLUSH_AFTER, IDLE_INTERVAL, ROUND_INTERVAL};

/// A replica whose log takes more than this on disk is flushed, so the log can be truncated.
const LOG_RETENTION_BYTES: u64 = 256 << 20;
/// The most flushes and compactions one round runs (besides memory-pressure flushes).
const OPS_PER_ROUND: usize = 4;
/// Finished operations the [`MaintenanceLog`] keeps.
pub const RECENT_OPS: usize = 100;

/// The maintenance thread of a tablet server; stops when dropped.
pub struct MaintenanceManager {
    signal: Arc<MaintenanceSignal>,
    log: Arc<MaintenanceLog>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// One flush or compaction: running, or done.
#[derive(Clone, Debug)]
pub struct MaintenanceRecord {
    pub tablet: String,
    /// `flush`, or the compaction (with the rowsets it rewrites).
    pub operation: String,
    /// Why it ran: its score, or memory pressure (the share of the limit the server held).
    pub score: f64,
    pub memory_pressure: bool,
    pub started: SystemTime,
    /// None while it runs.
    pub duration: Option<Duration>,
    pub error: Option<String>,
}

/// The operation the maintenance thread runs now and the last ones it ran.
#[derive(Default)]
pub struct MaintenanceLog {
    running: Mutex<Option<MaintenanceRecord>>,
    recent: Mutex<VecDeque<MaintenanceRecord>>,
}

impl MaintenanceLog {
    /// The operation running now, if any.
    pub fn running(&self) -> Option<MaintenanceRecord> {
        self.running.lock().clone()
    }

    /// The last operations done, newest first.
    pub fn recent(&self) -> Vec<MaintenanceRecord> {
        self.recent.lock().iter().rev().cloned().collect()
    }

    /// Runs `op` (one operation of `replica`) and records it, in the log and the metrics.
    fn record(
        &self,
        replica: &TabletReplica,
        kind: Option<&MaintenanceKind>,
        (score, memory_pressure): (f64, bool),
        op: impl FnOnce() -> crate::Result<()>,
    ) -> crate::Result<()> {
        let mut record = MaintenanceRecord {
            tablet: replica.id().to_string(),
            operation: kind.map_or_else(|| "flush".to_string(), |k| format!("{k:?}")),
            score,
            memory_pressure,
            started: SystemTime::now(),
            duration: None,
            error: None,
        };
        *self.running.lock() = Some(record.clone());
        let started = Instant::now();
        let done = op();
        let elapsed = started.elapsed();
        crate::metrics::engine().maintenance_done(
            kind.map_or("flush", MaintenanceKind::name),
            elapsed,
            done.is_ok(),
        );
        record.duration = Some(elapsed);
        record.error = done.as_ref().err().map(|e| e.to_string());
        *self.running.lock() = None;
        let mut recent = self.recent.lock();
        if recent.len() == RECENT_OPS {
            recent.pop_front();
        }
        recent.push_back(record);
        done
    }
}

/// A flush (`kind` None) or compaction of one replica, and its score.
pub struct MaintenanceCandidate {
    pub replica: Arc<TabletReplica>,
    pub kind: Option<MaintenanceKind>,
    pub score: f64,
}

/// Every flush and compaction of `replicas` with its score now (see the module comment); the
/// thread runs the best while it scores at least 1.
pub fn candidates(
    replicas: &[Arc<TabletReplica>],
    signal: &MaintenanceSignal,
) -> Vec<MaintenanceCandidate> {
    replicas
        .iter()
        .flat_map(|r| {
            let tablet = r.tablet();
            let memory = tablet.memory_bytes();
            // A long log counts only while a flush would let some of it go.
            let log = match memory {
                0 => 0.0,
                _ => r.log_bytes() as f64 / LOG_RETENTION_BYTES as f64,
            };
            let idle = match memory {
                0 => 0.0,
                _ => match signal.idle_for(r.id(), memory) >= IDLE_FLUSH_AFTER {
                    true => 1.0,
                    false => 0.0,
                },
            };
            let flush = (None, tablet.flush_score().max(log).max(idle));
            let compactions = tablet.maintenance_ops().into_iter();
            std::iter::once(flush)
                .chain(compactions.map(|op| (Some(op.kind), op.score)))
                .map(move |(kind, score)| MaintenanceCandidate {
                    replica: r.clone(),
                    kind,
                    score,
                })
        })
        .collect()
}

impl MaintenanceManager {
    /// A manager whose thread is not started yet (see [`Self::start`]).
    pub fn new() -> Self {
        Self {
            signal: Arc::default(),
            log: Arc::default(),
            thread: Mutex::new(None),
        }
    }

    /// Starts the thread, which maintains `server`'s tablets for as long as `server` lives.
    pub fn start(&self, server: Weak<TabletServer>) -> std::io::Result<()> {
        let signal = self.signal.clone();
        let log = self.log.clone();
        let thread = std::thread::Builder::new()
            .name("maintenance".into())
            .spawn(move || {
                // The first round, soon after the start, looks at what the tablets brought
                // from disk.
                let mut last = Instant::now();
                let (mut did_work, mut pending) = (true, false);
                while signal.wait_for_round(last, did_work, pending) {
                    last = Instant::now();
                    let Some(server) = server.upgrade() else {
                        break;
                    };
                    let replicas = server.replicas();
                    did_work = run_round(&replicas, server.memory_limit(), &signal, &log);
                    pending = replicas.iter().any(|r| r.tablet().memory_bytes() > 0);
                    let ids: Vec<&str> = replicas.iter().map(|r| r.id()).collect();
                    signal.forget_all_but(&ids);
                    signal.notify_flushed();
                }
            })?;
        *self.thread.lock() = Some(thread);
        Ok(())
    }

    /// What wakes the thread: for the replicas (writes) and writers (memory).
    pub fn signal(&self) -> &Arc<MaintenanceSignal> {
        &self.signal
    }

    /// What the thread runs and ran.
    pub fn log(&self) -> &MaintenanceLog {
        &self.log
    }

    /// Stops the thread once the operation it may be running has finished.
    pub fn stop(&self) {
        self.signal.stop();
        if let Some(thread) = self.thread.lock().take() {
            // The thread holds the server during a round, so it may be the one dropping it.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Default for MaintenanceManager {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for MaintenanceManager {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One round over `replicas` (see the module comment); whether it flushed or compacted
/// anything.
fn run_round(
    replicas: &[Arc<TabletReplica>],
    memory_limit: usize,
    signal: &MaintenanceSignal,
    log: &MaintenanceLog,
) -> bool {
    let mut did_work = false;
    let mut by_memory: Vec<(usize, &Arc<TabletReplica>)> = replicas
        .iter()
        .map(|r| (r.tablet().memory_bytes(), r))
        .collect();
    by_memory.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
    let mut total: usize = by_memory.iter().map(|(bytes, _)| bytes).sum();
    for (bytes, replica) in by_memory {
        if total <= memory_limit / 10 * 6 || bytes == 0 {
            break;
        }
        if signal.stopping() {
            return did_work;
        }
        tracing::debug!(
            tablet = replica.id(),
            bytes,
            total,
            "flushing under memory pressure"
        );
        let pressure = total as f64 / memory_limit.max(1) as f64;
        match log.record(replica, None, (pressure, true), || replica.flush()) {
            Ok(()) => did_work = true,
            Err(_) if replica.is_deleted() => {}
            Err(e) => tracing::error!(tablet = replica.id(), error = %e, "flush failed"),
        }
        signal.notify_flushed();
        total -= bytes;
    }
    for _ in 0..OPS_PER_ROUND {
        if signal.stopping() {
            return did_work;
        }
        let best = candidates(replicas, signal)
            .into_iter()
            .max_by(|a, b| a.score.total_cmp(&b.score));
        let Some(MaintenanceCandidate {
            replica,
            kind,
            score,
        }) = best.filter(|best| best.score >= 1.0)
        else {
            return did_work;
        };
        tracing::debug!(tablet = replica.id(), ?kind, score, "maintenance");
        let done = log.record(&replica, kind.as_ref(), (score, false), || match &kind {
            None => {
                let flushed = replica.flush();
                signal.notify_flushed();
                flushed
            }
            Some(kind) => replica.compact(kind),
        });
        if let Err(e) = done {
            // (Failing because its table was dropped meanwhile is no error.) Tried again at the
            // next round that writes or the idle interval bring.
            if !replica.is_deleted() {
                tracing::error!(tablet = replica.id(), error = %e, "maintenance failed");
            }
            return did_work;
        }
        did_work = true;
    }
    did_work
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use nyala_storage::{ColumnSchema, ColumnType, Schema, TabletOptions, WriteBatch, WriteKind};
    use nyala_testkit::wait_until;

    use crate::clock::HybridClock;
    use crate::tserver::TabletServer;

    fn schema() -> Schema {
        Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("v", ColumnType::String, false),
            ],
            vec![0],
        )
        .unwrap()
    }

    /// `n` rows of about 1 KB from key `first`.
    fn rows(schema: &Schema, first: i64, n: i64) -> WriteBatch {
        let keys = Int64Array::from_iter_values(first..first + n);
        let values = StringArray::from_iter_values((0..n).map(|_| "x".repeat(1000)));
        WriteBatch::new(
            WriteKind::Insert,
            RecordBatch::try_new(
                schema.arrow_schema(),
                vec![Arc::new(keys), Arc::new(values)],
            )
            .unwrap(),
        )
    }

    fn server(dir: &std::path::Path, flush_threshold: usize, limit: usize) -> Arc<TabletServer> {
        let options = TabletOptions {
            flush_threshold_bytes: flush_threshold,
            ..TabletOptions::default()
        };
        TabletServer::open(dir, options, limit, Arc::new(HybridClock::new()), None).unwrap()
    }

    /// The write itself wakes the thread: a tablet written past its flush threshold is
    /// flushed long before the idle interval, with nothing else going on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_past_the_flush_threshold_is_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path(), 64 << 10, crate::tserver::DEFAULT_MEMORY_LIMIT);
        let replica = server.create_tablet("t", &schema()).unwrap();
        // Past the first round: the thread sleeps for the idle interval.
        tokio::time::sleep(2 * super::ROUND_INTERVAL).await;
        replica.write(&rows(&schema(), 0, 200)).await.unwrap();
        // A liveness bound, not a timing: half the idle interval, so only a thread that waits
        // for that interval instead of the write's signal fails.
        let deadline = Instant::now() + super::IDLE_INTERVAL / 2;
        wait_until("a flush", super::IDLE_INTERVAL / 2, || async {
            replica.tablet().memory_bytes() == 0
        })
        .await;
        assert!(replica.tablet().disk_bytes() > 0);
        assert_eq!(replica.tablet().durable_index(), replica.last_applied());
        // Everything is durable in the tablet's files: its log goes.
        let left = deadline.saturating_duration_since(Instant::now());
        wait_until("the log to go", left, || async {
            match replica.log_bytes() {
                0 => Ok(()),
                bytes => Err(format!("log kept: {bytes} bytes")),
            }
        })
        .await;
        // Operators see it: in the log of recent operations, with the score that chose it.
        let recent = server.maintenance_log().recent();
        let flush = recent
            .iter()
            .find(|op| op.operation == "flush")
            .expect("a flush");
        assert_eq!(flush.tablet, "t");
        assert!(flush.score >= 1.0 && flush.duration.is_some() && flush.error.is_none());
        server.shutdown().unwrap();
    }

    /// A writer over the memory limit asks for a round and is let in by the flush it brings.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_over_the_memory_limit_waits_for_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path(), 1 << 30, 64 << 10);
        let replica = server.create_tablet("t", &schema()).unwrap();
        tokio::time::sleep(2 * super::ROUND_INTERVAL).await;
        replica.write(&rows(&schema(), 0, 200)).await.unwrap();
        server.admit_write().await.unwrap();
        assert!(server.memory_bytes() <= 64 << 10);
        assert!(replica.tablet().disk_bytes() > 0);
        server.shutdown().unwrap();
    }

    /// A tablet that stops taking writes is flushed once its unflushed data has stayed the
    /// same for the idle time, well below its flush threshold; a tablet still written is not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tablet_that_stops_taking_writes_is_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path(), 1 << 30, crate::tserver::DEFAULT_MEMORY_LIMIT);
        let replica = server.create_tablet("t", &schema()).unwrap();
        replica.write(&rows(&schema(), 0, 10)).await.unwrap();
        // A signal of its own: the server's thread keeps its own record of what it saw.
        let signal = super::MaintenanceSignal::default();
        let flush_score = |signal: &super::MaintenanceSignal| {
            let replicas = [replica.clone()];
            let all = super::candidates(&replicas, signal);
            all.into_iter().find(|c| c.kind.is_none()).unwrap().score
        };
        assert!(flush_score(&signal) < 1.0);
        // Its bytes seen unchanged since longer than the idle time: due for a flush.
        let bytes = replica.tablet().memory_bytes();
        let long_ago = Instant::now() - super::IDLE_FLUSH_AFTER - Duration::from_secs(1);
        signal.seen_unchanged_since("t", bytes, long_ago);
        assert!(flush_score(&signal) >= 1.0);
        // A write since then: not idle.
        signal.seen_unchanged_since("t", bytes, long_ago);
        replica.write(&rows(&schema(), 10, 1)).await.unwrap();
        assert!(flush_score(&signal) < 1.0);
        server.shutdown().unwrap();
    }
}
