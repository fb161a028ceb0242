//! What a replica has in flight: the timestamps of writes proposed but not yet applied, and
//! those storage holds (transactions prepared, a queue's rows waiting for their turn).
//!
//! A scan's snapshot is safe when nothing at or below it is in flight: the leader takes a
//! write's timestamp and enqueues its entry under this lock, so a write not yet in the set
//! gets a later timestamp than any snapshot read before.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nyala_storage::Timestamp;

/// Timestamps of writes proposed but not yet applied, and those storage holds (transactions
/// prepared but not yet committed or aborted, a queue's rows waiting for their turn); scans
/// that must read above one of them wait on `left` until it is applied or fails (a write) or
/// is released.
#[derive(Default)]
pub(super) struct InflightWrites {
    pending: parking_lot::Mutex<Pending>,
    left: parking_lot::Condvar,
    /// The newest timestamp rows became visible at, for readers waiting for new rows (see
    /// [`TabletReplica::wait_for_write`]).
    pub(super) written: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
pub(super) struct Pending {
    pub(super) writes: BTreeSet<u64>,
    /// Held timestamps: transactions prepared, rows waiting for their turn.
    held: BTreeSet<u64>,
}

impl Pending {
    /// Whether something at or below `snapshot` is still pending.
    fn below(&self, snapshot: Timestamp) -> bool {
        let at_or_below = |set: &BTreeSet<u64>| set.first().is_some_and(|&t| t <= snapshot.0);
        at_or_below(&self.writes) || at_or_below(&self.held)
    }
}

pub(super) type Inflight = Arc<InflightWrites>;

impl InflightWrites {
    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    /// Snapshots at and above each timestamp `holds.hold` wait (a transaction prepared, rows
    /// waiting for their turn) until it is in a later `holds.release`.
    pub(super) fn change_holds(&self, holds: &nyala_storage::Holds) {
        if holds.hold.is_empty() && holds.release.is_empty() {
            return;
        }
        let mut pending = self.pending.lock();
        pending.held.extend(holds.hold.iter().map(|t| t.0));
        for t in &holds.release {
            pending.held.remove(&t.0);
        }
        self.left.notify_all();
    }

    /// The write at `ts` was applied or failed.
    pub(super) fn remove(&self, ts: u64) {
        self.pending.lock().writes.remove(&ts);
        self.left.notify_all();
    }

    /// Waits until no write or prepared transaction at or below `snapshot` is pending; false
    /// after `timeout`.
    /// Whether every write and transaction below `snapshot` is applied.
    pub(super) fn applied(&self, snapshot: Timestamp) -> bool {
        !self.pending.lock().below(snapshot)
    }

    pub(super) fn wait_until_applied(&self, snapshot: Timestamp, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut pending = self.pending.lock();
        while pending.below(snapshot) {
            if self.left.wait_until(&mut pending, deadline).timed_out() {
                return !pending.below(snapshot);
            }
        }
        true
    }
}
