//! What wakes the maintenance thread, and when: replicas mark the server written as they
//! apply writes, writers short of memory ask for a round at once, and the thread waits for the
//! next round due (see the pacing in [`super`]'s comment). It knows no replica or server, so
//! a replica can hold it without depending on the maintenance that holds replicas.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The shortest time between two rounds that writes ask for.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(200);
/// The longest time between two rounds.
pub const IDLE_INTERVAL: Duration = Duration::from_secs(60);
/// A replica holding unflushed data that took no write for this long is flushed: its log can
/// then go, and a bulk load settles into its compact, compressed files soon after it ends.
pub const IDLE_FLUSH_AFTER: Duration = Duration::from_secs(30);

/// What wakes the maintenance thread. Replicas report the writes they apply; writers that wait
/// for memory ask for a round and wait for flushes.
#[derive(Default)]
pub struct MaintenanceSignal {
    /// A write was applied since the last round began (read without the lock: writes are many).
    wrote: AtomicBool,
    wake: Mutex<Wake>,
    condvar: Condvar,
    /// Notified after every flush and round, for writers waiting for memory.
    flushed: tokio::sync::Notify,
    /// Per replica: its unflushed bytes when last looked at, and since when they are so (they
    /// grow with every write, so unchanged bytes mean no writes).
    unchanged: Mutex<HashMap<String, (usize, Instant)>>,
}

#[derive(Default)]
struct Wake {
    memory_wanted: bool,
    stopping: bool,
}

impl MaintenanceSignal {
    /// A replica applied a write. Cheap when the server is marked written already.
    pub fn wrote(&self) {
        if self.wrote.swap(true, Ordering::AcqRel) {
            return;
        }
        // Taking the lock orders the flag before the thread's check-then-wait.
        let _wake = self.wake.lock();
        self.condvar.notify_one();
    }

    /// A writer waits for memory: run a round now.
    pub fn memory_wanted(&self) {
        self.wake.lock().memory_wanted = true;
        self.condvar.notify_one();
    }

    /// Resolves after the next flush or round. Enable it (see [`tokio::sync::Notified::enable`])
    /// before checking memory, so a flush in between is not missed.
    pub fn flushed(&self) -> tokio::sync::futures::Notified<'_> {
        self.flushed.notified()
    }

    pub(super) fn stopping(&self) -> bool {
        self.wake.lock().stopping
    }

    /// Stops the thread: its wait ends, and it runs no further operation.
    pub(super) fn stop(&self) {
        self.wake.lock().stopping = true;
        self.condvar.notify_one();
    }

    /// Wakes the writers waiting for memory (after a flush or a round).
    pub(super) fn notify_flushed(&self) {
        self.flushed.notify_waiters();
    }

    /// How long replica `tablet` has held the unflushed bytes it holds now without a write
    /// (zero the first time they are seen).
    pub(super) fn idle_for(&self, tablet: &str, bytes: usize) -> Duration {
        let now = Instant::now();
        let mut unchanged = self.unchanged.lock();
        match unchanged.get(tablet) {
            Some(&(seen, since)) if seen == bytes => now.saturating_duration_since(since),
            _ => {
                unchanged.insert(tablet.to_string(), (bytes, now));
                Duration::ZERO
            }
        }
    }

    /// Forgets the replicas not among `tablets` (gone from the server).
    pub(super) fn forget_all_but(&self, tablets: &[&str]) {
        self.unchanged
            .lock()
            .retain(|id, _| tablets.contains(&id.as_str()));
    }

    /// Records that replica `tablet` has held `bytes` since `since` (for tests of the idle
    /// flush, which cannot wait that long).
    #[cfg(test)]
    pub(super) fn seen_unchanged_since(&self, tablet: &str, bytes: usize, since: Instant) {
        (self.unchanged.lock()).insert(tablet.to_string(), (bytes, since));
    }

    /// Waits until a round is due, after a round began at `last` that `did_work` or not (and
    /// left unflushed data in some replica: `pending`); false once the manager stops.
    pub(super) fn wait_for_round(&self, last: Instant, did_work: bool, pending: bool) -> bool {
        let mut wake = self.wake.lock();
        loop {
            if wake.stopping {
                return false;
            }
            let wanted = did_work || self.wrote.load(Ordering::Acquire);
            // A writer waiting for memory is served at once, unless the last round found
            // nothing to flush: then it waits for the pace like everything else.
            if wake.memory_wanted && did_work {
                break;
            }
            let due = match (wanted || wake.memory_wanted, pending) {
                (true, _) => last + ROUND_INTERVAL,
                // Soon enough to flush what the last writes left once they have stopped.
                // (The round that saw the data last began a little before it looked.)
                (false, true) => last + IDLE_FLUSH_AFTER + ROUND_INTERVAL,
                (false, false) => last + IDLE_INTERVAL,
            };
            if Instant::now() >= due {
                break;
            }
            self.condvar.wait_until(&mut wake, due);
        }
        wake.memory_wanted = false;
        // Writes from here on ask for the next round.
        self.wrote.store(false, Ordering::Release);
        true
    }
}
