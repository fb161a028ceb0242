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
    /// [`super::TabletReplica::wait_for_write`]).
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

    /// Whether every write and transaction at or below `snapshot` is applied.
    pub(super) fn applied(&self, snapshot: Timestamp) -> bool {
        !self.pending.lock().below(snapshot)
    }

    /// Waits until no write or prepared transaction at or below `snapshot` is pending; false
    /// after `timeout`.
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

#[cfg(test)]
mod tests {
    use nyala_storage::Holds;

    use super::*;

    /// A snapshot is applied once no write at or below it is in flight; a waiter is woken
    /// when the write is applied, and gives up after its timeout otherwise.
    #[test]
    fn a_snapshot_waits_for_the_writes_at_or_below_it() {
        let inflight = Inflight::default();
        inflight.lock().writes.insert(10);
        assert!(inflight.applied(Timestamp(9)));
        assert!(!inflight.applied(Timestamp(10)));
        assert!(!inflight.wait_until_applied(Timestamp(10), Duration::from_millis(10)));

        let applier = inflight.clone();
        let apply = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            applier.remove(10);
        });
        assert!(inflight.wait_until_applied(Timestamp(u64::MAX), Duration::from_secs(60)));
        apply.join().unwrap();
        assert!(inflight.applied(Timestamp(10)));
    }

    /// A held timestamp (a prepared transaction) holds back the snapshots at and above it
    /// until it is released; empty holds change nothing.
    #[test]
    fn held_timestamps_hold_snapshots_until_released() {
        let inflight = Inflight::default();
        let hold = Holds {
            hold: vec![Timestamp(5), Timestamp(8)],
            ..Holds::default()
        };
        inflight.change_holds(&hold);
        inflight.change_holds(&Holds::default());
        assert!(inflight.applied(Timestamp(4)));
        assert!(!inflight.applied(Timestamp(5)));
        let release = Holds {
            release: vec![Timestamp(5)],
            ..Holds::default()
        };
        inflight.change_holds(&release);
        assert!(inflight.applied(Timestamp(7)));
        assert!(!inflight.applied(Timestamp(8)));
        // Removing a write does not release a hold at the same timestamp.
        inflight.remove(8);
        assert!(!inflight.applied(Timestamp(8)));
    }
}
