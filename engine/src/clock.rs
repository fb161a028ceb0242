//! Hybrid logical clock (Kudu's HybridTime): the physical time in microseconds in the high bits,
//! a logical counter in the low 12 bits, so timestamps are unique, strictly increasing within a
//! process and close to wall time (which makes `AS OF` reads meaningful later).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nyala_storage::Timestamp;

const LOGICAL_BITS: u32 = 12;

#[derive(Debug, Default)]
pub struct HybridClock {
    last: AtomicU64,
}

impl HybridClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// A timestamp greater than every one this clock returned before.
    pub fn now(&self) -> Timestamp {
        let physical = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
            << LOGICAL_BITS;
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = physical.max(last + 1);
            match self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Timestamp(next),
                Err(seen) => last = seen,
            }
        }
    }

    /// Moves the clock past a timestamp seen elsewhere (e.g. in a replayed log entry).
    pub fn observe(&self, ts: Timestamp) {
        self.last.fetch_max(ts.0, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_increasing_and_observes() {
        let clock = HybridClock::new();
        let mut prev = clock.now();
        for _ in 0..10_000 {
            let ts = clock.now();
            assert!(ts > prev);
            prev = ts;
        }
        let future = Timestamp(prev.0 + (1 << 40));
        clock.observe(future);
        assert!(clock.now() > future);
    }
}
